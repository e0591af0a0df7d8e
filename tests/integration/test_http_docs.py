"""The HTTP guide's curl examples run as written against a gateway, and the
edges of the gateway's input a newcomer hit (issue 40): a body that is not
UTF-8, and `POST …/sessions` naming its id as the reply does.

The curl blocks carry a skip marker (curl is not part of the checkout, so
tests/integration/test_doc_snippets.py does not run them); this file runs
each block whose marker names it, in bash, with the gateway's URL in place
of the docs' default."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest
from docsnippets import snippets
from test_http_gateway import error_of, gateway_settings, indexing, stack

from memq.workers.settings import HttpSettings

GUIDE = "docs/guide/http.md"
DOC_HTTP_URL = "http://127.0.0.1:8480"
CURL = [s for s in snippets() if s.path == GUIDE and s.skip and "test_http_docs.py" in s.skip]


def test_the_guide_has_curl_examples_for_this_file_to_run():
    assert CURL, f"no curl block in {GUIDE} names tests/integration/test_http_docs.py"
    assert all("curl " in s.code for s in CURL)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_the_curl_examples_run_as_written(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path, apps={})  # as `memq up`: no keys
    async with stack(settings) as http, indexing(settings):
        for snippet in CURL:
            code = snippet.code.replace(DOC_HTTP_URL, str(http.base_url).rstrip("/"))
            run = await _bash(code, tmp_path)
            assert run.returncode == 0, f"{snippet.id}:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
            answers = [json.loads(line) for line in re.sub(r"\}\{", "}\n{", run.stdout).splitlines() if line]
            history = next(a for a in answers if "events" in a)
            assert [e["event"]["message"]["parts"][0]["text"] for e in history["events"]] == ["Book Lisbon"]
            found = next(a for a in answers if "results" in a)
            assert [r["session_id"] for r in found["results"]] == ["trip/lisbon"]


def test_the_apps_setting_the_guide_shows_is_what_the_gateway_takes():
    shown = [s for s in snippets() if s.path == GUIDE and "MEMQ_HTTP__APPS=" in s.code]
    assert shown, f"{GUIDE} shows no MEMQ_HTTP__APPS"
    for snippet in shown:
        value = shlex.split(snippet.code.split("MEMQ_HTTP__APPS=", 1)[1])[0]
        http = HttpSettings.model_validate({"apps": json.loads(value)})
        assert all(app.api_key.get_secret_value() for app in http.apps.values())


async def test_a_body_that_is_not_utf8_is_422_naming_the_body(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path, apps={})) as http:
        body = b'{"events": [{"author": "\xff\xfe"}]}'
        sent = await http.post(
            "/v1/apps/a/users/u/sessions/s/events", content=body, headers={"Content-Type": "application/json"}
        )
        error = error_of(sent, 422)
        assert error["code"] == "invalid_request"
        assert error["message"].startswith("body: not UTF-8") and f"byte {body.index(0xFF)}" in error["message"], error


async def test_a_new_session_takes_its_id_as_session_as_the_reply_names_it(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path, apps={})) as http:
        path = "/v1/apps/a/users/u/sessions"
        for body, expected in (({"session": "s1"}, "s1"), ({"session_id": "s2"}, "s2"), ({}, None)):
            created = await http.post(path, json=body)
            assert created.status_code == 201, created.text
            assert created.json()["session"] == expected or (expected is None and created.json()["session"])
        both = await http.post(path, json={"session": "s3", "session_id": "s4"})
        assert "give one" in error_of(both, 422)["message"]
        same = await http.post(path, json={"session": "s5", "session_id": "s5"})
        assert same.status_code == 201 and same.json()["session"] == "s5"


async def _bash(code: str, cwd) -> subprocess.CompletedProcess:
    import asyncio

    return await asyncio.to_thread(
        subprocess.run,
        ["bash", "-e", "-o", "pipefail", "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )

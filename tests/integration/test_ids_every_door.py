"""Every id the contract accepts (any UTF-8 of 1..256 bytes) is reachable on
every door: the client, the HTTP gateway, the MCP server and the CLI (issue
40: the gateway answered 404 for a session or user id holding ``/``).

Each door writes and reads back sessions whose app, user and session ids hold
``/``, ``%``, ``.``, ``*``, ``>``, spaces and non-ASCII letters."""

from __future__ import annotations

import json
from urllib.parse import quote

from helpers import make_settings, run_memq, running_query, running_worker
from test_http_gateway import error_of, gateway_settings, turn
from test_http_gateway import stack as http_stack
from test_mcp import call, stdio_server
from test_mcp import stack as mcp_stack

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart

IDS = ["a/b", "/", "50%", "%2F", "a%2Fb/c", "v1.2", ".", "..", "a/../b", "*", ">", "a b", "Zoë/日本 ✓", "x" * 256]
APP = "my/app.v1 *>%"


def segment(id_: str) -> str:
    """An id as one path segment: percent-encoded, "/" and "%" included; an id
    of dots only as %2E each, which no client resolves as "." or ".."."""
    return "%2E" * len(id_) if set(id_) == {"."} else quote(id_, safe="")


def said(text: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))


async def test_the_client_reaches_every_id(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(settings), running_query(settings):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            for i, id_ in enumerate(IDS):
                await client.append(id_, id_, said(f"turn {i}"))
                await client.set_state(id_, {f"k{i}": id_}, session=id_)
            for i, id_ in enumerate(IDS):
                view = await client.get_session(id_, id_, events=True)
                assert (view.app, view.user, view.session) == (APP, id_, id_)
                assert [e.event["message"]["parts"][0]["text"] for e in view.events or []] == [f"turn {i}"]
                assert view.state == {f"k{i}": id_}
                assert [s.session for s in (await client.list_sessions(id_)).sessions] == [id_]
            assert {s.user for s in (await client.list_sessions()).sessions} == set(IDS)
            await client.delete_session("a/b", "a/b")
            assert {s.user for s in (await client.list_sessions()).sessions} == set(IDS) - {"a/b"}


async def test_the_http_gateway_reaches_every_id(nats_url, sqlite_url, tmp_path):
    async with http_stack(gateway_settings(nats_url, sqlite_url, tmp_path, apps={})) as http:
        app = f"/v1/apps/{segment(APP)}"
        for i, id_ in enumerate(IDS):
            user = f"{app}/users/{segment(id_)}"
            session = f"{user}/sessions/{segment(id_)}"
            created = await http.post(f"{user}/sessions", json={"session_id": id_})
            assert created.status_code == 201, (id_, created.text)
            assert (created.json()["user"], created.json()["session"]) == (id_, id_)
            appended = await http.post(f"{session}/events", json={"events": [turn("user", f"turn {i}")]})
            assert appended.status_code == 202, (id_, appended.text)
            seq = appended.json()["seq"]
            patched = await http.patch(f"{session}/state", json={"set": {f"k{i}": id_}})
            assert patched.status_code == 202, (id_, patched.text)
            seq = patched.json()["seq"]

            got = await http.get(session, params={"min_seq": seq, "events": "true"})
            assert got.status_code == 200, (id_, got.text)
            body = got.json()
            assert (body["app"], body["user"], body["session"]) == (APP, id_, id_)
            assert body["state"] == {f"k{i}": id_}
            history = await http.get(f"{session}/history")
            assert history.status_code == 200, (id_, history.text)
            assert [e["event"]["message"]["parts"][0]["text"] for e in history.json()["events"]] == [f"turn {i}"]
            listed = await http.get(f"{user}/sessions")
            assert [s["session"] for s in listed.json()["sessions"]] == [id_], (id_, listed.text)
            by_app = await http.get(f"{app}/sessions", params={"user": id_})
            assert [s["user"] for s in by_app.json()["sessions"]] == [id_], (id_, by_app.text)

        user = f"{app}/users/{segment('a/b')}"
        deleted = await http.delete(f"{user}/sessions/{segment('a/b')}")
        assert deleted.status_code == 202, deleted.text
        gone = await http.get(f"{user}/sessions/{segment('a/b')}", params={"min_seq": deleted.json()["seq"]})
        assert error_of(gone, 404)["code"] == "not_found"
        # an id still names one segment: "a/b" sent as two is another path, not a/b's session
        assert (await http.get(f"{app}/users/a/b/sessions/{segment('a/b')}")).status_code == 404
        # a decoded path still works for plain ids, and the OpenAPI paths are the plain templates
        paths = (await http.get("/openapi.json")).json()["paths"]
        assert "/v1/apps/{app}/users/{user}/sessions/{session}/history" in paths


async def test_an_app_id_with_a_slash_takes_its_own_key_only(nats_url, sqlite_url, tmp_path):
    keys = {"a/b": "key-of-a-slash-b-0123", "a": "key-of-a-0123456789"}
    async with http_stack(gateway_settings(nats_url, sqlite_url, tmp_path, apps=keys)) as http:
        path = f"/v1/apps/{segment('a/b')}/users/{segment('u/v')}/sessions"
        mine = await http.post(path, json={"session_id": "s/t"}, headers={"X-API-Key": keys["a/b"]})
        assert mine.status_code == 201, mine.text
        assert (mine.json()["app"], mine.json()["user"], mine.json()["session"]) == ("a/b", "u/v", "s/t")
        # app "a"'s key names app "a", not the "a" of "a%2Fb", at the door and in the route
        assert "not for app 'a/b'" in error_of(await http.get(path, headers={"X-API-Key": keys["a"]}), 403)["message"]
        listed = await http.get(path, headers={"X-API-Key": keys["a/b"]}, params={"min_seq": mine.json()["seq"]})
        assert [s["session"] for s in listed.json()["sessions"]] == ["s/t"], listed.text


async def test_the_mcp_server_reaches_every_id(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with mcp_stack(settings), stdio_server(settings, APP) as mcp:
        for i, id_ in enumerate(IDS):
            note = await call(mcp, "remember", user=id_, session=id_, text=f"turn {i} zebra{i}")
            assert (note["user"], note["session"]) == (id_, id_)
        for i, id_ in enumerate(IDS):
            read = await call(mcp, "read_session", user=id_, session=id_)
            assert [e["event"]["message"]["parts"][0]["text"] for e in read["events"]] == [f"turn {i} zebra{i}"]
            assert [s["session"] for s in (await call(mcp, "list_sessions", user=id_))["sessions"]] == [id_]
            found = await call(mcp, "search_memory", user=id_, query=f"zebra{i}", mode="keyword")
            assert [r["session_id"] for r in found["results"]] == [id_]


async def test_the_cli_reaches_every_id(nats_url, sqlite_url, tmp_path):
    settings = make_settings(nats_url, sqlite_url, tmp_path)
    ids = ["a/b", "50%", "..", "*>", "Zoë/日本 ✓"]
    async with running_worker(settings), running_query(settings):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            for id_ in ids:
                await client.append(id_, id_, said(f"what the CLI reads of {id_}"))
            await client.get_session(ids[-1], ids[-1])  # committed
        for id_ in ids:
            shown = await run_memq(settings, "sessions", "show", "--app", APP, "--user", id_, id_, "--events", "1")
            assert shown.returncode == 0, shown.stderr
            assert f"what the CLI reads of {id_}" in shown.stdout
            history = await run_memq(settings, "history", "-a", APP, "-u", id_, id_, "--strategy", "all")
            assert history.returncode == 0 and f"what the CLI reads of {id_}" in history.stdout, history.stderr
        deleted = await run_memq(settings, "sessions", "delete", "-a", APP, "-u", "a/b", "a/b", "--yes")
        assert deleted.returncode == 0, deleted.stderr
        gone = await run_memq(settings, "history", "-a", APP, "-u", "a/b", "a/b")
        assert gone.returncode == 1 and "not_found" in gone.stderr


def test_the_ids_are_what_the_contract_accepts():
    from memq.contracts.ids import validate_id

    assert all(validate_id(i) == i for i in [*IDS, APP])
    assert json.dumps(IDS)  # plain JSON strings for the MCP and HTTP bodies

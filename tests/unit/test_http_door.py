"""The gateway's front door (workers/http/door.py) as pure ASGI: which
requests reach the routes, and which are refused without a byte of their
body read (no server: ``receive`` counts what was read)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import SecretStr

from memq.workers.http.door import BodyLimits, FrontDoor
from memq.workers.http.keys import Keyring
from memq.workers.settings import HttpSettings

KEYS = {"app-a": "key-of-a-0123456789", "app-b": "key-of-b-9876543210"}
LIMITS = BodyLimits(max_bytes=1000, max_json_elements=20, max_json_depth=4)


def keyring(open_: bool = False) -> Keyring:
    apps = {} if open_ else {a: {"api_key": SecretStr(k)} for a, k in KEYS.items()}
    return Keyring.from_settings(HttpSettings(apps=apps))


async def serve(
    path: str, headers: dict[str, str], chunks: list[bytes], method: str = "POST", open_: bool = False
) -> tuple[int | None, dict | None, int, bytes | None]:
    """(status answered by the door or None, its error, chunks read, body the routes got or None)."""
    read = 0
    sent: list[dict] = []
    reached: list[bytes] = []

    async def inner(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        reached.append(body)

    async def receive():
        nonlocal read
        read += 1
        if read > len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    door = FrontDoor(inner, keyring(open_), LIMITS, public=["/openapi.json", "/docs"])
    await door(scope, receive, send)
    status = sent[0]["status"] if sent else None
    error = json.loads(sent[1]["body"])["error"] if sent else None
    return status, error, read, reached[0] if reached else None


A_KEY = {"Authorization": f"Bearer {KEYS['app-a']}"}


@pytest.mark.parametrize("path", ["/anything", "/v2/x", "/", "/v1/apps/", "/openapi.json/x"])
async def test_a_keyless_request_anywhere_is_401_and_nothing_is_read(path):
    status, error, read, reached = await serve(path, {}, [b"x" * 500, b"y" * 400])
    assert (status, error and error["code"], read, reached) == (401, "unauthenticated", 0, None)


async def test_an_unknown_key_off_the_app_paths_is_401_and_any_apps_key_passes():
    assert (await serve("/anything", {"X-API-Key": "nope"}, [b"{}"]))[:3] == (401, {
        "code": "unauthenticated", "message": "unknown API key"}, 0)  # fmt: skip
    status, _, _, reached = await serve("/anything", {"X-API-Key": KEYS["app-b"]}, [b"{}"])
    assert status is None and reached == b"{}"  # to the router: its 404


async def test_on_an_apps_path_another_apps_key_is_403_unread():
    status, error, read, _ = await serve("/v1/apps/app-a/users/u/sessions", {"X-API-Key": KEYS["app-b"]}, [b"{}"])
    assert (status, error and error["code"], read) == (403, "not_allowed", 0)


async def test_the_documents_need_no_key_and_get_no_body():
    status, _, read, reached = await serve("/docs", {}, [b"x" * 900], method="GET")
    assert (status, read, reached) == (None, 0, b"")
    # not another method, nor another path below them
    assert (await serve("/docs", {}, [b"x"], method="POST"))[0] == 401


async def test_an_open_gateway_takes_no_key_anywhere():
    assert (await serve("/anything", {}, [b"{}"], open_=True))[3] == b"{}"
    assert (await serve("/anything", A_KEY, [b"{}"], open_=True))[0] == 401


async def test_a_body_over_the_json_budget_is_refused_at_the_chunk_that_passes_it():
    chunks = [b'{"events": [', b"{}," * 5, b"{}," * 10, b"{}" * 100, b"]}"]
    status, error, read, reached = await serve("/v1/apps/app-a/x", A_KEY, chunks)
    assert (status, error and error["code"], read, reached) == (413, "oversize", 3, None)
    assert error and "more than 20 elements (http.max_json_elements)" in error["message"]

    deep = await serve("/v1/apps/app-a/x", A_KEY, [b"[[[", b"[[", b"]]]]]"])
    assert deep[:3] == (413, deep[1], 2) and "http.max_json_depth" in (deep[1] or {})["message"]


async def test_a_body_within_every_limit_reaches_the_route_whole():
    chunks = [b'{"events": [{"text": "a,b,c[[[[[[[["}', b', {"k": [1, 2]}]}']
    status, _, read, reached = await serve("/v1/apps/app-a/x", A_KEY, chunks)
    assert (status, read, reached) == (None, 2, b"".join(chunks))


async def test_the_byte_cap_holds_for_a_declared_and_a_streamed_body():
    declared = await serve("/v1/apps/app-a/x", {**A_KEY, "Content-Length": "1001"}, [b"x"])
    assert declared[:3] == (413, declared[1], 0) and "http.max_body_bytes" in (declared[1] or {})["message"]
    streamed = await serve("/v1/apps/app-a/x", A_KEY, [b'"' + b"x" * 600, b"x" * 600 + b'"'])
    assert streamed[:3] == (413, streamed[1], 2)


async def through(door: FrontDoor, path: str, key: str, chunks: list[bytes] = [b"{}"]) -> tuple[list[dict], int]:  # noqa: B006
    """What ``door`` sends for a POST of ``chunks`` with ``key``, and how many chunks it read."""
    read, sent = 0, []

    async def receive():
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": b"",
             "headers": [(b"x-api-key", key.encode())]}  # fmt: skip
    await door(scope, receive, send)
    return sent, read


async def test_a_key_past_its_in_flight_cap_is_429_unread_and_other_keys_pass():
    release = asyncio.Event()
    entered: list[str] = []

    async def inner(scope, receive, send):
        entered.append(scope["path"])
        await release.wait()  # a slow answer (a read waiting for its min_seq)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    door = FrontDoor(inner, keyring(), LIMITS, key_inflight=2)
    held = [asyncio.create_task(through(door, "/v1/apps/app-a/x", KEYS["app-a"])) for _ in range(2)]
    while len(entered) < 2:
        await asyncio.sleep(0)
    sent, read = await through(door, "/v1/apps/app-a/x", KEYS["app-a"])
    assert (sent[0]["status"], read) == (429, 0)
    assert dict(sent[0]["headers"])[b"retry-after"] == b"1"
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "busy" and "http.key_inflight" in error["message"]

    other = asyncio.create_task(through(door, "/v1/apps/app-b/x", KEYS["app-b"]))  # not counted with A's
    while len(entered) < 3:
        await asyncio.sleep(0)
    release.set()
    for task in (*held, other):
        assert (await task)[0][0]["status"] == 200
    again, _ = await through(door, "/v1/apps/app-a/x", KEYS["app-a"])  # the finished ones gave their places back
    assert again[0]["status"] == 200 and door.inflight.count("app-a") == 0


async def test_a_request_refused_for_its_body_gives_its_place_back():
    async def inner(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    door = FrontDoor(inner, keyring(), LIMITS, key_inflight=1)
    refused, _ = await through(door, "/v1/apps/app-a/x", KEYS["app-a"], [b"[" + b"{}," * 30 + b"{}]"])
    assert refused[0]["status"] == 413
    wrong, read = await through(door, "/v1/apps/app-a/x", KEYS["app-b"])  # another app's key: 403, never counted
    assert (wrong[0]["status"], read) == (403, 0)
    assert (await through(door, "/v1/apps/app-a/x", KEYS["app-a"]))[0][0]["status"] == 200
    assert door.inflight.count("app-a") == door.inflight.count("app-b") == 0

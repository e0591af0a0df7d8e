"""The HTTP gateway over a real stack (NATS, SQL, the persistence and query
workers) through a real HTTP client: every endpoint end to end, apps kept
apart by their keys, clear errors for bad input, and a large session read
page by page."""

from __future__ import annotations

import dataclasses
from contextlib import asynccontextmanager

import httpx
import pytest
from helpers import make_settings, running, running_query, running_worker

from memq.workers.http.worker import HttpGateway
from memq.workers.settings import Settings

KEYS = {"app-a": "key-of-a-0123456789", "app-b": "key-of-b-9876543210"}
KB = "x" * 1000


def gateway_settings(nats_url: str, db_url: str, tmp_path, apps: dict[str, str] | None = None) -> Settings:
    base = make_settings(nats_url, db_url, tmp_path)
    keys = KEYS if apps is None else apps
    return base.model_copy(
        update={
            "http": base.http.model_validate({"port": 0, "apps": {a: {"api_key": k} for a, k in keys.items()}}),
            # each page computed: no answer comes from the cache
            "cache": base.cache.model_validate({**base.cache.model_dump(), "backend": "none"}),
        }
    )


@asynccontextmanager
async def indexing(settings: Settings):
    """A keyword-only indexing worker (no model to load), for search."""
    from memq.workers.indexing.worker import IndexingWorker

    keyword_only = settings.model_copy(
        update={"indexing": settings.indexing.model_validate({**settings.indexing.model_dump(), "embedder": "none"})}
    )
    async with running(IndexingWorker(keyword_only)) as worker:
        await worker.ready.wait()
        yield


@asynccontextmanager
async def stack(settings: Settings, reply_bytes: int | None = None):
    async with running_worker(settings), running_query(settings) as query, running(HttpGateway(settings)) as gateway:
        if reply_bytes is not None:  # smaller pages than the server's max_payload allows
            query.ctx = dataclasses.replace(query.ctx, reply_bytes=reply_bytes)
        assert (settings.run_dir / "http.url").read_text() == gateway.url
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            yield http


def as_app(app: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[app]}"}


def turn(role: str, text: str) -> dict:
    return {"author": role, "message": {"role": role, "parts": [{"type": "text", "text": text}]}}


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()["error"]


async def test_sessions_events_history_context_and_state_end_to_end(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings) as http:
        a = "/v1/apps/app-a/users/u"
        created = await http.post(
            f"{a}/sessions", json={"session_id": "s1", "state": {"topic": "tea"}}, headers=as_app("app-a")
        )
        assert created.status_code == 201, created.text
        assert created.json()["session"] == "s1" and created.json()["seq"] >= 1

        appended = await http.post(
            f"{a}/sessions/s1/events",
            json={"events": [turn("user", "Which tea is best at night?"), turn("assistant", "Chamomile.")]},
            headers=as_app("app-a"),
        )
        assert appended.status_code == 202, appended.text
        seq = appended.json()["seq"]
        assert appended.json()["seqs"] == [seq - 1, seq]

        # read-your-writes: a read given the write's seq sees it
        history = await http.get(
            f"{a}/sessions/s1/history", params={"min_seq": seq, "strategy": "all"}, headers=as_app("app-a")
        )
        assert history.status_code == 200, history.text
        assert [e["event"]["message"]["parts"][0]["text"] for e in history.json()["events"]] == [
            "Which tea is best at night?",
            "Chamomile.",
        ]
        assert history.json()["tokens"] > 0

        context = await http.get(
            f"{a}/sessions/s1/context",
            params={"format": "openai", "instruction": "Talk about {topic}.", "min_seq": seq},
            headers=as_app("app-a"),
        )
        assert context.status_code == 200, context.text
        messages = context.json()["messages"]
        assert messages[0] == {"role": "system", "content": "Talk about tea."}
        assert messages[-1]["content"] == "Chamomile."
        posted = await http.post(
            f"{a}/sessions/s1/context",
            json={"format": "openai", "instruction": "Talk about {topic}.", "min_seq": seq},
            headers=as_app("app-a"),
        )
        assert posted.json()["messages"] == messages

        session = await http.get(f"{a}/sessions/s1", params={"events": True}, headers=as_app("app-a"))
        assert session.json()["state"] == {"topic": "tea"} and len(session.json()["events"]) == 2

        changed = await http.patch(
            f"{a}/sessions/s1/state", json={"set": {"mood": "calm", "user:lang": "en"}}, headers=as_app("app-a")
        )
        assert changed.status_code == 202, changed.text
        state = await http.get(
            f"{a}/sessions/s1/state", params={"min_seq": changed.json()["seq"]}, headers=as_app("app-a")
        )
        assert state.json()["state"] == {"topic": "tea", "mood": "calm", "user:lang": "en"}
        deleted = await http.patch(f"{a}/state", json={"delete": ["user:lang"]}, headers=as_app("app-a"))
        user_state = await http.get(f"{a}/state", params={"min_seq": deleted.json()["seq"]}, headers=as_app("app-a"))
        assert user_state.json()["state"] == {}

        unindexed = await http.get(f"{a}/search", params={"q": "tea", "mode": "keyword"}, headers=as_app("app-a"))
        assert "no index has been built yet" in error_of(unindexed, 503)["message"]
        async with indexing(settings):
            found = await http.get(
                f"{a}/search", params={"q": "tea night", "mode": "keyword", "min_seq": seq}, headers=as_app("app-a")
            )
            assert found.status_code == 200, found.text
            assert [r["content"] for r in found.json()["results"]][:1] == ["Which tea is best at night?"]

        gone = await http.delete(f"{a}/sessions/s1", headers=as_app("app-a"))
        assert gone.status_code == 202
        missing = await http.get(f"{a}/sessions/s1", params={"min_seq": gone.json()["seq"]}, headers=as_app("app-a"))
        assert error_of(missing, 404)["code"] == "not_found"


async def test_sessions_are_listed_in_pages_with_a_cursor(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path)) as http:
        a = "/v1/apps/app-a/users/u"
        seq = 0
        for i in range(5):
            seq = (await http.post(f"{a}/sessions", json={"session_id": f"s{i}"}, headers=as_app("app-a"))).json()[
                "seq"
            ]
        seen, cursor = [], None
        while True:
            params = {"limit": 2, "min_seq": seq, **({"cursor": cursor} if cursor else {})}
            page = (await http.get(f"{a}/sessions", params=params, headers=as_app("app-a"))).json()
            assert len(page["sessions"]) <= 2
            seen += [s["session"] for s in page["sessions"]]
            if not (cursor := page["next_cursor"]):
                break
        assert sorted(seen) == [f"s{i}" for i in range(5)]
        everyone = await http.get("/v1/apps/app-a/sessions", params={"limit": 500}, headers=as_app("app-a"))
        assert {s["session"] for s in everyone.json()["sessions"]} == set(seen)


async def test_one_apps_key_never_reaches_another_apps_data(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path)) as http:
        a, b = "/v1/apps/app-a/users/u", "/v1/apps/app-b/users/u"
        created = await http.post(f"{a}/sessions", json={"session_id": "secret"}, headers=as_app("app-a"))
        seq = created.json()["seq"]
        await http.post(
            f"{a}/sessions/secret/events", json={"events": [turn("user", "a's secret")]}, headers=as_app("app-a")
        )

        # B's key on A's paths: refused before anything reaches NATS, reads and writes alike
        for method, path, body in (
            ("GET", f"{a}/sessions/secret", None),
            ("GET", f"{a}/sessions/secret/history", None),
            ("GET", f"{a}/sessions", None),
            ("GET", "/v1/apps/app-a/sessions", None),
            ("GET", f"{a}/search?q=secret", None),
            ("POST", f"{a}/sessions/secret/events", {"events": [turn("user", "b was here")]}),
            ("DELETE", f"{a}/sessions/secret", None),
            ("DELETE", f"{a}/sessions/secret/events/{seq + 1}", None),
            ("PATCH", f"{a}/state", {"set": {"user:x": 1}}),
        ):
            refused = await http.request(method, path, json=body, headers=as_app("app-b"))
            assert error_of(refused, 403)["code"] == "not_allowed", (method, path)
        # B's own paths do not hold A's session
        assert error_of(await http.get(f"{b}/sessions/secret", params={"min_seq": seq}, headers=as_app("app-b")), 404)
        listed = await http.get("/v1/apps/app-b/sessions", params={"min_seq": seq}, headers=as_app("app-b"))
        assert listed.json()["sessions"] == []

        # no key, an unknown key, a key in the wrong scheme: 401
        assert error_of(await http.get(f"{a}/sessions/secret"), 401)["code"] == "unauthenticated"
        unknown = await http.get(f"{a}/sessions/secret", headers={"Authorization": "Bearer nope"})
        assert error_of(unknown, 401)["message"] == "unknown API key"
        assert unknown.headers["www-authenticate"] == "Bearer"
        basic = await http.get(f"{a}/sessions/secret", headers={"Authorization": f"Basic {KEYS['app-a']}"})
        assert error_of(basic, 401)
        # the key as X-API-Key works as well as a bearer token
        mine = await http.get(f"{a}/sessions/secret", params={"events": True}, headers={"X-API-Key": KEYS["app-a"]})
        assert [e["event"]["message"]["parts"][0]["text"] for e in mine.json()["events"]] == ["a's secret"]


async def test_bad_input_is_a_clear_error(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path)) as http:
        a, h = "/v1/apps/app-a/users/u", as_app("app-a")
        cases = [
            (
                http.post(
                    f"{a}/sessions/s/events", content=b"{not json", headers={**h, "Content-Type": "application/json"}
                ),
                "body",
            ),
            (http.post(f"{a}/sessions/s/events", json={"events": []}, headers=h), "events"),
            (http.post(f"{a}/sessions/s/events", json={"events": [{"author": 3}]}, headers=h), "author"),
            (http.post(f"{a}/sessions/s/events", json={"events": [turn("robot", "hi")]}, headers=h), "role"),
            (http.post(f"{a}/sessions", json={"session_id": "s", "surprise": 1}, headers=h), "surprise"),
            (http.get(f"{a}/sessions", params={"limit": 0}, headers=h), "limit"),
            (http.get(f"{a}/sessions/s/history", params={"strategy": "everything"}, headers=h), "strategy"),
            (http.get(f"{a}/sessions/s/context", params={"recall_limit": 101}, headers=h), "recall_limit"),
            (http.get(f"{a}/search", headers=h), "q"),
            # The contract's roles, named in the error (a typo would otherwise match nothing).
            (http.get(f"{a}/search", params={"q": "x", "roles": "asistant"}, headers=h), "'tool' or 'summary'"),
            (http.get(f"{a}/sessions/s/history", params={"roles": "summary"}, headers=h), "'system' or 'tool'"),
            (http.patch(f"{a}/sessions/s/state", json={}, headers=h), "nothing to change"),
            (
                http.patch(f"{a}/sessions/s/state", json={"set": {"k": 1}, "delete": ["k"]}, headers=h),
                "both set and deleted",
            ),
            (http.get(f"{a}/sessions/s/events", params={"cursor": "forged"}, headers=h), "cursor"),
            (http.get("/v1/apps/app-a/users/u%00x/sessions/s", headers=h), "user"),
        ]
        for request, says in cases:
            response = await request
            error = error_of(response, 422)
            assert error["code"] in ("invalid_request", "invalid_id", "invalid_message"), error
            assert says in error["message"], (says, error)
        unknown_route = await http.get("/v1/nothing-here", headers=h)
        assert error_of(unknown_route, 404)["code"] == "not_found"
        assert error_of(await http.put(f"{a}/sessions/s", headers=h), 405)["code"] == "method_not_allowed"
        # the document is served
        served = await http.get("/openapi.json")
        assert served.status_code == 200 and "/v1/apps/{app}/users/{user}/sessions" in served.json()["paths"]
        assert (await http.get("/docs")).status_code == 200


async def test_a_large_session_is_read_page_by_page(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path), reply_bytes=16_384) as http:
        a, h = "/v1/apps/app-a/users/u", as_app("app-a")
        events = [turn("user" if i % 2 == 0 else "assistant", f"{i} {KB}") for i in range(400)]
        seqs: list[int] = []
        for start in range(0, len(events), 100):
            seqs += (
                await http.post(f"{a}/sessions/big/events", json={"events": events[start : start + 100]}, headers=h)
            ).json()["seqs"]

        async def read_all(path: str, **params) -> tuple[list[dict], int]:
            got, cursor, pages = [], None, 0
            while True:
                query = {**params, "min_seq": seqs[-1], **({"cursor": cursor} if cursor else {})}
                page = await http.get(path, params=query, headers=h)
                assert page.status_code == 200, page.text
                assert len(page.content) <= 16_384 + 1024  # one NATS page per HTTP page
                got += page.json()["events"]
                pages += 1
                if not (cursor := page.json()["next_cursor"]):
                    return got, pages

        got, pages = await read_all(f"{a}/sessions/big/events")
        assert pages > 10
        assert [e["seq"] for e in got] == seqs
        assert [e["event"]["message"]["parts"][0]["text"] for e in got] == [
            e["message"]["parts"][0]["text"] for e in events
        ]
        history, pages = await read_all(f"{a}/sessions/big/history", strategy="all")
        assert pages > 10 and [e["seq"] for e in history] == seqs
        # an appended event does not shift a read in progress: the cursor pins its snapshot
        first = (await http.get(f"{a}/sessions/big/events", params={"min_seq": seqs[-1]}, headers=h)).json()
        await http.post(f"{a}/sessions/big/events", json={"events": [turn("user", "late")]}, headers=h)
        cursor, rest = first["next_cursor"], []
        while cursor:
            page = (await http.get(f"{a}/sessions/big/events", params={"cursor": cursor}, headers=h)).json()
            rest += page["events"]
            cursor = page["next_cursor"]
        assert [e["seq"] for e in first["events"] + rest] == seqs


async def test_an_open_gateway_needs_no_key_and_refuses_one(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path, apps={})) as http:
        created = await http.post("/v1/apps/any-app/users/u/sessions", json={"session_id": "s"})
        assert created.status_code == 201, created.text
        got = await http.get("/v1/apps/any-app/users/u/sessions/s", params={"min_seq": created.json()["seq"]})
        assert got.json()["session"] == "s"
        refused = await http.get("/v1/apps/any-app/users/u/sessions/s", headers={"X-API-Key": "k"})
        assert "no API keys configured" in error_of(refused, 401)["message"]


def test_an_open_gateway_must_listen_on_loopback(tmp_path):
    with pytest.raises(ValueError, match="without a key on 0.0.0.0"):
        HttpGateway(Settings(data_dir=tmp_path, http={"host": "0.0.0.0"}))
    HttpGateway(Settings(data_dir=tmp_path, http={"host": "0.0.0.0", "apps": {"a": {"api_key": "k"}}}))
    with pytest.raises(ValueError, match="same API key"):
        HttpGateway(Settings(data_dir=tmp_path, http={"apps": {"a": {"api_key": "k"}, "b": {"api_key": "k"}}}))


async def test_writers_through_the_gateway_see_and_fence_each_other(nats_url, sqlite_url, tmp_path):
    """The gateway reads with consistency="any": a read right after another
    client's acknowledged append (a Python client beside it) holds it; and
    an append with a stale expect_seq is a 409 conflict, not an interleaving."""
    from memq.contracts.client import MemoryClient

    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path)) as http:
        a, h = "/v1/apps/app-a/users/u", as_app("app-a")
        seq = (await http.post(f"{a}/sessions", json={"session_id": "s"}, headers=h)).json()["seq"]
        async with await MemoryClient.connect(nats_url, app="app-a") as other:
            for i in range(20):
                await other.append_text("u", "s", "user", f"from python {i}")
                events = (await http.get(f"{a}/sessions/s/events", headers=h)).json()["events"]
                assert events[-1]["event"]["message"]["parts"][0]["text"] == f"from python {i}"
            last = other.last_seq
        stale = await http.post(
            f"{a}/sessions/s/events", json={"events": [turn("user", "late")], "expect_seq": seq}, headers=h
        )
        conflict = error_of(stale, 409)
        assert conflict["code"] == "conflict" and str(last) in conflict["message"]
        fresh = await http.post(
            f"{a}/sessions/s/events", json={"events": [turn("user", "on time")], "expect_seq": last}, headers=h
        )
        assert fresh.status_code == 202, fresh.text


async def test_a_missing_session_is_404_unless_an_append_may_create_it(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings) as http:
        a, key = "/v1/apps/app-a/users/u", as_app("app-a")
        hi = {"events": [turn("user", "hi")]}
        refused = await http.post(f"{a}/sessions/does-not-exist/events", json={**hi, "create": False}, headers=key)
        assert "no session 'does-not-exist'" in error_of(refused, 404)["message"]
        assert "nothing appended" in refused.json()["error"]["message"]
        assert error_of(await http.get(f"{a}/sessions/does-not-exist", headers=key), 404)["code"] == "not_found"

        started = await http.post(f"{a}/sessions/chat/events", json=hi, headers=key)  # the default: create
        assert started.status_code == 202, started.text
        more = await http.post(f"{a}/sessions/chat/events", json={**hi, "create": False}, headers=key)
        assert more.status_code == 202, more.text

        never = await http.delete(f"{a}/sessions/never-existed", headers=key)
        assert error_of(never, 404)["code"] == "not_found" and "nothing deleted" in never.json()["error"]["message"]
        assert (await http.delete(f"{a}/sessions/chat", headers=key)).status_code == 202
        assert error_of(await http.delete(f"{a}/sessions/chat", headers=key), 404)["code"] == "not_found"
        after = await http.post(f"{a}/sessions/chat/events", json={**hi, "create": False}, headers=key)
        assert error_of(after, 404)["code"] == "not_found"


async def test_one_event_is_forgotten_and_only_by_its_apps_key(nats_url, sqlite_url, tmp_path):
    async with stack(gateway_settings(nats_url, sqlite_url, tmp_path)) as http:
        a, key = "/v1/apps/app-a/users/u", as_app("app-a")
        appended = await http.post(
            f"{a}/sessions/chat/events",
            json={"events": [turn("user", "my pin is 1234"), turn("user", "hi")]},
            headers=key,
        )
        secret, kept = appended.json()["seqs"]

        # another app's key, on A's path or on its own: A's event stays
        refused = await http.delete(f"{a}/sessions/chat/events/{secret}", headers=as_app("app-b"))
        assert error_of(refused, 403)["code"] == "not_allowed"
        elsewhere = await http.delete(f"/v1/apps/app-b/users/u/sessions/chat/events/{secret}", headers=as_app("app-b"))
        assert error_of(elsewhere, 404)["code"] == "not_found"

        forgot = await http.delete(f"{a}/sessions/chat/events/{secret}", headers=key)
        assert forgot.status_code == 202, forgot.text
        left = await http.get(f"{a}/sessions/chat/events", params={"min_seq": forgot.json()["seq"]}, headers=key)
        assert [e["seq"] for e in left.json()["events"]] == [kept]

        again = await http.delete(f"{a}/sessions/chat/events/{secret}", headers=key)
        assert "nothing forgotten" in error_of(again, 404)["message"]
        stale = await http.delete(f"{a}/sessions/chat/events/{kept}", params={"expect_seq": kept - 1}, headers=key)
        assert error_of(stale, 409)["code"] == "conflict"
        assert error_of(await http.delete(f"{a}/sessions/chat/events/0", headers=key), 422)["code"] == "invalid_request"


async def test_the_users_state_path_takes_keys_without_a_prefix(nats_url, sqlite_url, tmp_path):
    settings = gateway_settings(nats_url, sqlite_url, tmp_path)
    async with stack(settings) as http:
        a, key = "/v1/apps/app-a/users/carol", as_app("app-a")
        changed = await http.patch(f"{a}/state", json={"set": {"lang": "fr", "app:theme": "dark"}}, headers=key)
        assert changed.status_code == 202, changed.text
        state = await http.get(f"{a}/state", params={"min_seq": changed.json()["seq"]}, headers=key)
        assert state.json()["state"] == {"user:lang": "fr", "app:theme": "dark"}  # read as every session sees it
        created = await http.post(f"{a}/sessions", json={"session_id": "s1"}, headers=key)
        seen = await http.get(f"{a}/sessions/s1/state", params={"min_seq": created.json()["seq"]}, headers=key)
        assert seen.json()["state"] == {"user:lang": "fr", "app:theme": "dark"}

        deleted = await http.patch(f"{a}/state", json={"delete": ["lang"]}, headers=key)
        state = await http.get(f"{a}/state", params={"min_seq": deleted.json()["seq"]}, headers=key)
        assert state.json()["state"] == {"app:theme": "dark"}
        both = await http.patch(f"{a}/state", json={"set": {"lang": "fr", "user:lang": "en"}}, headers=key)
        assert "with and without the user: prefix" in error_of(both, 422)["message"]
        clash = await http.patch(f"{a}/state", json={"set": {"lang": "fr"}, "delete": ["user:lang"]}, headers=key)
        assert "both set and deleted: ['user:lang']" in error_of(clash, 422)["message"]
        # A session's path is unchanged: an unprefixed key is the session's own.
        session_set = await http.patch(f"{a}/sessions/s1/state", json={"set": {"mood": "calm"}}, headers=key)
        user_state = await http.get(f"{a}/state", params={"min_seq": session_set.json()["seq"]}, headers=key)
        assert "mood" not in str(user_state.json()["state"])

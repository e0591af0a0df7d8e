"""The fact reads on real NATS and SQL, against facts the fact worker derives
(with the scripted endpoint of fakes.py): facts with and without a query,
the invalidated ones on request, the profile, one fact's history, and a read
with min_seq that waits for the derivation or says how far behind it is.
Another app's reads of them are refused by the fence (test_security.py)."""

from __future__ import annotations

import json

import httpx
import pytest
from fakes import FactBrain
from helpers import make_settings, run_memq, running, running_query, running_worker, wait_committed
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from test_http_gateway import indexing
from test_mcp import MEMQ, call, mcp_env

from memq.contracts.client import MemoryClient
from memq.contracts.errors import InvalidRequest, NotFound
from memq.contracts.schemas import Event, Message, TextPart
from memq.workers.facts.worker import FactWorker
from memq.workers.http.worker import HttpGateway

pytestmark = pytest.mark.timeout(120)

APP = "fact-reads"


def said(text: str) -> Event:
    return Event(author="user", message=Message(role="user", parts=[TextPart(text=text)]))


@pytest.fixture
def brain():
    b = FactBrain()
    yield b
    b.close()


def settings_for(nats_url, sqlite_url, tmp_path, url):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    s.facts = type(s.facts).model_validate(
        {"llm": {"base_url": url, "model": "brain", "retries": 0}, "sweep_interval_s": 0.3, "retry_after_s": 0.3}
    )
    return s


async def test_facts_profile_and_history_read_what_was_derived(nats_url, sqlite_url, tmp_path, brain):
    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    async with running_worker(s), running_query(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            before = await client.facts("u1")
            assert before.facts == [] and before.generation is not None and before.behind == 0
            await client.append("u1", "s1", said("I live in Boston and I like pottery."))
            moved = await client.append("u1", "s2", said("I moved to Denver. I like jazz."))
            view = await client.facts("u1", min_seq=moved)  # waits for the derivation
            assert view.behind == 0
            # current ones, oldest first: Boston was invalidated by Denver
            assert view.facts[0].statement == "The user likes pottery."
            assert {f.statement for f in view.facts[1:]} == {"The user likes jazz.", "The user lives in Denver."}
            denver = next(f for f in view.facts if "Denver" in f.statement)
            assert [s.seq for s in denver.sources] == [moved] and denver.sources[0].session == "s2"
            everything = await client.facts("u1", include_invalid=True)
            boston = next(f for f in everything.facts if "Boston" in f.statement)
            assert boston.invalidated_by == denver.id and boston.invalid_from == denver.valid_from

            ranked = await client.facts("u1", "where does the user live?", include_invalid=True)
            top = {f.statement for f in ranked.facts[:2]}
            assert top == {"The user lives in Denver.", "The user lives in Boston."}  # "live" outweighs "the user"
            scores = [f.score or 0 for f in ranked.facts]
            assert ranked.mode == "hybrid" and scores == sorted(scores, reverse=True)
            by_word = await client.facts("u1", "where does the user live?", include_invalid=True, mode="keyword")
            assert by_word.mode == "keyword" and all((f.score or 0) > 0 for f in by_word.facts)
            assert [f.statement for f in (await client.facts("u1", "pottery")).facts] == ["The user likes pottery."]
            assert (await client.facts("u1", "quantum chromodynamics")).facts == []  # the floor: no shared word
            assert len((await client.facts("u1", limit=1)).facts) == 1

            profile = await client.profile("u1")
            assert {e.entity: [f.statement for f in e.facts] for e in profile.entities} == {
                "pottery": ["The user likes pottery."],
                "jazz": ["The user likes jazz."],
                "Denver": ["The user lives in Denver."],
            }
            history = await client.fact_history("u1", boston.id)
            assert [(r.kind, r.fact.invalid_from) for r in history.revisions] == [
                ("added", None),
                ("invalidated", denver.valid_from),
            ]
            with pytest.raises(NotFound):
                await client.fact_history("someone-else", boston.id)  # another user's fact: not found
            with pytest.raises(InvalidRequest):
                await client.fact_history("u1", "not-an-id")


async def test_a_read_with_min_seq_says_how_far_behind_the_facts_are(nats_url, sqlite_url, tmp_path):
    slow = FactBrain(delay_s=3.0)
    s = settings_for(nats_url, sqlite_url, tmp_path, slow.url)
    try:
        async with running_worker(s), running_query(s), running(FactWorker(s)):
            async with await MemoryClient.connect(nats_url, app=APP, wait_ms=300) as client:
                seq = await client.append("u1", "s1", said("I live in Oslo."))
                await wait_committed(nats_url, seq)
                early = await client.facts("u1", min_seq=seq)  # 300 ms are not enough
                assert early.behind == 1 and early.facts == []
                assert (await client.profile("u1", min_seq=seq)).behind == 1
                late = MemoryClient(client.nc, APP, wait_ms=10_000)
                done = await late.facts("u1", min_seq=seq)
                assert done.behind == 0 and [f.statement for f in done.facts] == ["The user lives in Oslo."]
    finally:
        slow.close()


async def test_memq_facts_commands_list_search_profile_and_history(nats_url, sqlite_url, tmp_path, brain):
    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    async with running_worker(s), running_query(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("ada", "s1", said("I live in Lyon and I like trains."))
            seq = await client.append("ada", "s2", said("I moved to Paris."))
            await client.facts("ada", min_seq=seq)
        listed = await run_memq(s, "facts", "list", "--user", "ada", "--app", APP, "--all", "--json")
        assert listed.returncode == 0, listed.stderr
        facts = json.loads(listed.stdout)["facts"]
        assert {f["statement"] for f in facts} == {
            "The user lives in Lyon.",
            "The user likes trains.",
            "The user lives in Paris.",
        }
        lyon = next(f for f in facts if "Lyon" in f["statement"])
        found = await run_memq(s, "facts", "search", "trains", "--user", "ada", "--app", APP)
        assert found.returncode == 0 and "The user likes trains." in found.stdout and "Paris" not in found.stdout
        shown = await run_memq(s, "facts", "profile", "--user", "ada", "--app", APP)
        assert shown.returncode == 0 and "Paris" in shown.stdout and "Lyon" not in shown.stdout  # current only
        history = await run_memq(s, "facts", "history", lyon["id"], "--user", "ada", "--app", APP)
        assert history.returncode == 0 and "added" in history.stdout and "invalidated" in history.stdout
        missing = await run_memq(s, "facts", "history", lyon["id"], "--user", "bob", "--app", APP)
        assert missing.returncode != 0 and "no fact" in missing.stderr
        told = await run_memq(s, "context", "s2", "--user", "ada", "--app", APP, "--facts", "2", "--json")
        assert told.returncode == 0, told.stderr
        assert [k["statement"] for k in json.loads(told.stdout)["context"]["known"]] == [
            "The user lives in Paris.",
            "The user likes trains.",
        ]
        meant = await run_memq(s, "facts", "search", "railway", "--user", "ada", "--app", APP, "--mode", "keyword")
        assert meant.returncode == 0 and "trains" not in meant.stdout  # no shared word, and keyword only


async def test_the_gateway_serves_the_fact_reads_and_fences_them_by_key(nats_url, sqlite_url, tmp_path, brain):
    keys = {APP: "key-of-facts-0123456789", "other": "key-of-other-9876543210"}
    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    s.http = s.http.model_validate({"port": 0, "apps": {a: {"api_key": k} for a, k in keys.items()}})
    mine, theirs = {"X-API-Key": keys[APP]}, {"X-API-Key": keys["other"]}
    async with running_worker(s), running_query(s), running(FactWorker(s)), running(HttpGateway(s)) as gateway:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("ann", "s1", said("I live in Rome and I like opera."))
        base = f"/v1/apps/{APP}/users/ann"
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
            listed = await http.get(f"{base}/facts", params={"min_seq": seq}, headers=mine)
            assert listed.status_code == 200, listed.text
            assert listed.json()["behind"] == 0 and len(listed.json()["facts"]) == 2
            found = (await http.get(f"{base}/facts", params={"q": "opera"}, headers=mine)).json()["facts"]
            assert [f["statement"] for f in found] == ["The user likes opera."] and found[0]["score"] > 0
            profile = (await http.get(f"{base}/profile", headers=mine)).json()
            assert {e["entity"] for e in profile["entities"]} == {"Rome", "opera"}
            fact = found[0]["id"]
            history = await http.get(f"{base}/facts/{fact}/history", headers=mine)
            assert [r["kind"] for r in history.json()["revisions"]] == ["added"]
            assert (await http.get(f"{base}/facts/not-a-fact/history", headers=mine)).status_code == 422
            told = await http.get(f"{base}/sessions/s1/context", params={"facts_limit": 5}, headers=mine)
            assert told.status_code == 200, told.text
            assert {k["statement"] for k in told.json()["context"]["known"]} == {
                "The user lives in Rome.",
                "The user likes opera.",
            }
            posted = await http.post(f"{base}/sessions/s1/context", json={"facts_limit": 1}, headers=mine)
            assert posted.status_code == 200 and len(posted.json()["context"]["known"]) == 1
            by_word = await http.get(f"{base}/facts", params={"q": "opera", "mode": "keyword"}, headers=mine)
            assert by_word.json()["mode"] == "keyword" and len(by_word.json()["facts"]) == 1
            for path in (f"{base}/facts", f"{base}/profile", f"{base}/facts/{fact}/history"):  # another app's key
                refused = await http.get(path, headers=theirs)
                assert refused.status_code == 403 and refused.json()["error"]["code"] == "not_allowed", path
            other = await http.get(f"/v1/apps/other/users/ann/facts/{fact}/history", headers=theirs)
            assert other.status_code == 404  # its own path: the fact is not its app's


async def test_the_mcp_server_tells_a_model_what_is_known(nats_url, sqlite_url, tmp_path, brain):
    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    async with running_worker(s), running_query(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("u", "s1", said("I live in Kyoto and I like tea."))
            await client.facts("u", min_seq=seq)
        server = StdioServerParameters(command=MEMQ, args=["mcp", "--app", APP, "--user", "u"], env=mcp_env(s))
        async with Client(server, read_timeout_seconds=60) as mcp:
            tools = {t.name: t for t in (await mcp.list_tools()).tools}
            assert tools["known_facts"].annotations.read_only_hint is True
            known = await call(mcp, "known_facts")
            assert {f["statement"] for f in known["facts"]} == {"The user lives in Kyoto.", "The user likes tea."}
            assert known["behind"] == 0 and all(f["sources"][0]["seq"] == seq for f in known["facts"])
            found = await call(mcp, "known_facts", query="tea")
            assert [f["statement"] for f in found["facts"]] == ["The user likes tea."]
            assert (await call(mcp, "known_facts", user="nobody"))["facts"] == []
            told = await call(mcp, "get_context", session="s1", facts_limit=5)
            assert {k["statement"] for k in told["context"]["known"]} == {
                "The user lives in Kyoto.",
                "The user likes tea.",
            }


async def test_adk_s_memory_service_answers_facts_first_when_asked(nats_url, sqlite_url, tmp_path, brain):
    from memq.contracts.adapters.adk import MemqMemoryService

    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    async with running_worker(s), running_query(s), indexing(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("u", "s1", said("I live in Lima and I like surfing."))
            await client.facts("u", min_seq=seq)
            plain = await MemqMemoryService(client, mode="keyword").search_memory(
                app_name=APP, user_id="u", query="surfing"
            )
            assert [m.author for m in plain.memories] == ["user"]  # memories only, as ADK's own services
            both = await MemqMemoryService(client, mode="keyword", facts=3).search_memory(
                app_name=APP, user_id="u", query="surfing"
            )
    fact, memory = both.memories
    assert fact.author == "memq:facts" and fact.content.parts[0].text == "The user likes surfing."
    assert fact.custom_metadata["kind"] == "fact" and fact.custom_metadata["sources"] == [{"session": "s1", "seq": seq}]
    assert memory.content.parts[0].text == "I live in Lima and I like surfing."


async def test_a_fact_is_found_by_meaning_and_the_floor_drops_the_unrelated(nats_url, sqlite_url, tmp_path, brain):
    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)  # the default embedder: MiniLM
    async with running_worker(s), running_query(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("u2", "s1", said("I live in Boston."))
            await client.append("u2", "s1", said("I like pottery."))
            seq = await client.append("u2", "s1", said("I like jazz."))
            assert len((await client.facts("u2", min_seq=seq)).facts) == 3
            meant = await client.facts("u2", "ceramics hobby")  # no word in common with any fact
            assert meant.mode == "hybrid" and [f.statement for f in meant.facts] == ["The user likes pottery."]
            assert (await client.facts("u2", "ceramics hobby", mode="keyword")).facts == []
            music = await client.facts("u2", "what music do I enjoy?", mode="vector")
            assert [f.statement for f in music.facts] == ["The user likes jazz."]
            for mode in ("hybrid", "vector"):
                assert (await client.facts("u2", "quantum chromodynamics", mode=mode)).facts == []  # the floor


async def test_a_context_tells_the_model_what_is_known_and_is_never_stale(nats_url, sqlite_url, tmp_path, brain):
    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    async with running_worker(s), running_query(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("u3", "s1", said("I live in Boston."))
            seq = await client.append("u3", "s1", said("I like pottery."))
            await client.facts("u3", min_seq=seq)
            plain = await client.context("u3", "s1", min_seq=seq)
            assert plain.tokens["known"] == 0 and plain.context["known"] == []
            ctx = await client.context("u3", "s1", facts_limit=5, format="openai")
            assert ctx.messages[0]["content"].splitlines() == [
                "What is known about the user:",
                "- The user likes pottery.",  # what the last user message relates to first
                "- The user lives in Boston.",
            ]
            assert ctx.tokens["known"] > 0
            assert ctx.tokens["total"] == sum(v for k, v in ctx.tokens.items() if k != "total") + 3
            moved = await client.append("u3", "s1", said("I moved to Denver."))
            await client.facts("u3", min_seq=moved)
            again = await client.context("u3", "s1", facts_limit=5, format="openai")  # not cached: Denver now
            assert again.messages[0]["content"].splitlines()[1:] == [
                "- The user lives in Denver.",
                "- The user likes pottery.",
            ]  # Boston was contradicted
            one = await client.context("u3", "s1", facts_limit=1)
            assert [k["statement"] for k in one.context["known"]] == ["The user lives in Denver."]


async def test_langgraph_s_store_reads_the_facts_namespace_and_refuses_writes(nats_url, sqlite_url, tmp_path, brain):
    from langgraph.store.base import InvalidNamespaceError

    from memq.contracts.adapters.langgraph import MemqStore
    from memq.contracts.adapters.langgraph_context import MemqContext

    s = settings_for(nats_url, sqlite_url, tmp_path, brain.url)
    async with running_worker(s), running_query(s), running(FactWorker(s)):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("lg", "s1", said("I live in Quito."))
            seq = await client.append("lg", "s1", said("I like birds."))
            await client.facts("lg", min_seq=seq)
            store = MemqStore(client)
            everything = await store.asearch(("lg", "memq_facts"))
            assert [i.value["statement"] for i in everything] == ["The user lives in Quito.", "The user likes birds."]
            assert everything[0].value["sources"][0]["session"] == "s1" and everything[0].value["entities"] == ["Quito"]
            found = await store.asearch(("lg", "memq_facts"), query="birds")
            assert [i.value["statement"] for i in found] == ["The user likes birds."] and found[0].score is not None
            assert [i.key for i in await store.asearch(("lg", "memq_facts"), offset=1)] == [everything[1].key]
            filtered = await store.asearch(("lg", "memq_facts"), filter={"entities": ["Quito"]})
            assert [i.key for i in filtered] == [everything[0].key]
            item = await store.aget(("lg", "memq_facts"), everything[1].key)
            assert item is not None and item.value["statement"] == "The user likes birds."
            assert await store.aget(("lg", "memq_facts"), "f" * 32) is None
            assert await store.aget(("lg", "memq_facts"), "not-an-id") is None
            assert await store.aget(("someone", "memq_facts"), everything[1].key) is None  # another user's
            with pytest.raises(InvalidNamespaceError):
                await store.aput(("lg", "memq_facts"), "k", {"statement": "The user is a cat."})
            assert await store.asearch(("lg", "memq_facts"), query="cat") == []
            memory = MemqContext(client, facts_limit=2)
            prepared = await memory.aprepare(
                {"messages": [("user", "any birds today?")]}, {"configurable": {"thread_id": "t", "user_id": "lg"}}
            )
            first = prepared["llm_input_messages"][0].content.splitlines()
            assert first == ["What is known about the user:", "- The user likes birds.", "- The user lives in Quito."]

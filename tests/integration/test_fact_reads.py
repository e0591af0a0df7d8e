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
            assert scores == sorted(scores, reverse=True) and scores[-1] > 0
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

"""The fact worker on real NATS and SQL: facts derived from a session's
turns with their sources, a contradiction that invalidates and keeps the
history, forgetting that removes a fact for good (a rebuild does not bring it
back), a malformed reply dead-lettered with its reason, a worker killed
mid-batch that loses and duplicates nothing, two apps whose facts never
meet, and a changed prompt that builds a new generation with no gap in reads.

The mechanics are checked against a scripted endpoint (:class:`fakes.FactBrain`,
deterministic rules in place of a model), and extraction once against the
real Gemma 3 270M on llama-cpp-python (whose facts are crude: only their
shape and sources are asserted)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from fakes import FactBrain
from helpers import (
    WorkerProcess,
    make_settings,
    running,
    running_query,
    running_worker,
    wait_committed,
    wait_for,
)
from services import LlamaServer
from sqlalchemy import func, select

from memq.contracts.client import MemoryClient
from memq.contracts.schemas import Event, Message, TextPart
from memq.contracts.subjects import DLQ_STREAM
from memq.workers.facts.worker import FactWorker
from memq.workers.runtime.dead_letters import DeadLetterFilter, list_dead_letters
from memq.workers.settings import Settings
from memq.workers.sql import facts as store
from memq.workers.sql import models
from memq.workers.sql.engine import create_engine
from memq.workers.status import discover_instances

pytestmark = pytest.mark.timeout(300)

APP = "facts-app"


@pytest.fixture
def brain():
    made: list[FactBrain] = []

    def make(**kw) -> FactBrain:
        made.append(FactBrain(**kw))
        return made[-1]

    yield make
    for b in made:
        b.close()


@pytest.fixture(params=["sqlite_url", "pg_url", "mariadb_url"])
def db_url(request) -> str:
    """Each SQL backend: the fact tables and their conditional writes are plain Core, checked on all three."""
    return request.getfixturevalue(request.param)


def fact_settings(nats_url: str, db_url: str, tmp_path, url: str, **facts) -> Settings:
    s = make_settings(nats_url, db_url, tmp_path)
    llm = {"base_url": url, "model": "brain", "retries": 0, "timeout_s": 30, **facts.pop("llm", {})}
    s.facts = type(s.facts).model_validate(
        {"llm": llm, "sweep_interval_s": 0.3, "retry_after_s": 0.3, "lease_ttl_s": 3, **facts}
    )
    return s


def said(role: str, text: str) -> Event:
    return Event(author=role, message=Message(role=role, parts=[TextPart(text=text)]))


async def live_facts(settings: Settings, app: str, user: str) -> dict:
    engine = create_engine(settings.database_url())
    try:
        async with engine.connect() as conn:
            gen = await store.live_generation(conn)
            return {} if gen is None else await store.user_facts(conn, gen.name, app, user)
    finally:
        await engine.dispose()


async def settled(settings: Settings, app: str, user: str, seq: int, timeout: float = 30) -> None:
    """Until ``seq`` is committed and the user's facts are derived past it."""
    await wait_committed(settings.nats.url, seq)
    await wait_for(lambda: derived(settings, app, user), timeout=timeout, what=f"facts of {app}/{user} derived")


async def derived(settings: Settings, app: str, user: str) -> bool:
    engine = create_engine(settings.database_url())
    try:
        async with engine.connect() as conn:
            gen = await store.live_generation(conn)
            return gen is not None and await store.behind(conn, gen.name, app, user) == 0
    finally:
        await engine.dispose()


async def test_facts_are_derived_with_their_sources_and_a_contradiction_keeps_history(
    nats_url, db_url, tmp_path, brain
):
    b = brain()
    s = fact_settings(nats_url, db_url, tmp_path, b.url)
    async with running_worker(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seqs = [
                await client.append("u1", "s1", said("user", "Hello! I live in Boston and I like pottery.")),
                await client.append("u1", "s1", said("assistant", "Nice to meet you.")),
            ]
            await settled(s, APP, "u1", seqs[-1])
            facts = await live_facts(s, APP, "u1")
            assert sorted(f.statement for f in facts.values()) == [
                "The user likes pottery.",
                "The user lives in Boston.",
            ]
            assert all([src.seq for src in f.sources] == [seqs[0]] for f in facts.values())
            assert all(src.session == "s1" for f in facts.values() for src in f.sources)
            boston = next(f for f in facts.values() if "Boston" in f.statement)

            moved = await client.append("u1", "s2", said("user", "News: I moved to Denver last week."))
            await settled(s, APP, "u1", moved)
            facts = await live_facts(s, APP, "u1")
    denver = next(f for f in facts.values() if "Denver" in f.statement)
    old = facts[boston.id]
    assert denver.current and denver.sources[0].seq == moved
    assert not old.current and old.invalidated_by == denver.id and old.invalid_from == denver.valid_from
    assert facts["".join(k for k in facts if facts[k].statement == "The user likes pottery.")].current
    engine = create_engine(s.database_url())
    try:
        async with engine.connect() as conn:
            gen = await store.live_generation(conn)
            assert gen is not None
            history = await store.revisions(conn, gen.name, boston.id)
    finally:
        await engine.dispose()
    assert [r.kind for r in history] == ["added", "invalidated"]  # nothing overwritten in place
    assert history[0].fact.current and not history[1].fact.current
    assert worker.stats.dead_lettered == 0 and worker.stats.failures == 0


async def test_forgetting_a_source_removes_the_fact_and_a_rebuild_does_not_bring_it_back(
    nats_url, db_url, tmp_path, brain
):
    b = brain()
    s = fact_settings(nats_url, db_url, tmp_path, b.url)
    async with running_worker(s), running_query(s):  # forget_event asks the query service first
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            async with running(FactWorker(s)):
                secret = await client.append("u1", "s1", said("user", "I live in Lisbon."))
                chess = await client.append("u1", "s1", said("user", "Also, I like chess."))
                await settled(s, APP, "u1", chess)
                assert len(await live_facts(s, APP, "u1")) == 2
                await client.forget_event("u1", "s1", secret)

                async def gone() -> bool:
                    return [f.statement for f in (await live_facts(s, APP, "u1")).values()] == ["The user likes chess."]

                await wait_for(gone, timeout=30, what="the forgotten fact removed")
            # A new prompt (another model name): a new generation replayed from SQL
            s2 = fact_settings(nats_url, db_url, tmp_path, b.url, llm={"model": "brain-2"})
            async with running(FactWorker(s2)) as rebuilt:
                await wait_for(lambda: asyncio.sleep(0, bool(rebuilt.stats.promoted)), timeout=30, what="rebuild")
                facts = await live_facts(s2, APP, "u1")
    assert [f.statement for f in facts.values()] == ["The user likes chess."]
    assert all(src.seq != secret for f in facts.values() for src in f.sources)


async def test_a_malformed_reply_is_dead_lettered_with_its_reason(nats_url, sqlite_url, tmp_path, brain):
    b = brain(garbage=2)  # both asks of the first batch
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url, invalid_attempts=2)
    async with running_worker(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("u1", "s1", said("user", "I live in Oslo."))
            await settled(s, APP, "u1", seq)
            nc = await nats.connect(nats_url)
            try:
                letters = await list_dead_letters(nc.jetstream(), DLQ_STREAM, DeadLetterFilter(worker="facts"))
            finally:
                await nc.close()
            # the next batch is derived as usual
            tea = await client.append("u1", "s1", said("user", "I like tea."))
            await settled(s, APP, "u1", tea)
            facts = await live_facts(s, APP, "u1")
    assert len(letters) == 1, letters
    letter = letters[0]
    assert letter.code == "fact_reply_invalid" and letter.original_seq == seq
    assert f"{APP}/u1/s1 up to seq {seq}: the extraction: not JSON" in letter.reason
    assert letter.data == b"this is not json {"  # the reply itself
    assert worker.stats.dead_lettered == 1
    assert [f.statement for f in facts.values()] == ["The user likes tea."]  # Oslo's batch was not guessed


async def test_two_apps_facts_never_meet(nats_url, sqlite_url, tmp_path, brain):
    b = brain()
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url)
    async with running_worker(s), running(FactWorker(s)):
        async with (
            await MemoryClient.connect(nats_url, app="app-a") as a,
            await MemoryClient.connect(nats_url, app="app-b") as other,
        ):
            rome = await a.append("same-user", "s", said("user", "I live in Rome."))
            kyoto = await other.append("same-user", "s", said("user", "I live in Kyoto."))
            await settled(s, "app-a", "same-user", rome)
            await settled(s, "app-b", "same-user", kyoto)
            mine = await live_facts(s, "app-a", "same-user")
            theirs = await live_facts(s, "app-b", "same-user")
    # Kyoto did not invalidate Rome: the decision saw only its own app's facts
    assert [(f.statement, f.current) for f in mine.values()] == [("The user lives in Rome.", True)]
    assert [(f.statement, f.current) for f in theirs.values()] == [("The user lives in Kyoto.", True)]
    assert not set(mine) & set(theirs)


async def test_a_worker_killed_mid_batch_loses_and_duplicates_no_fact(nats_url, sqlite_url, tmp_path, brain):
    b = brain(delay_s=1.5)
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url)
    env = {
        "MEMQ_FACTS__LLM__BASE_URL": b.url,
        "MEMQ_FACTS__LLM__MODEL": "brain",
        "MEMQ_FACTS__SWEEP_INTERVAL_S": "0.3",
        "MEMQ_FACTS__LEASE_TTL_S": "2",
    }
    async with running_worker(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            first = WorkerProcess(s, tmp_path / "facts-1.log", kind="facts", env=env).start().wait_ready()
            try:
                cairo = await client.append("u1", "s1", said("user", "I live in Cairo and I like maps."))
                await wait_for(lambda: asyncio.sleep(0, b.calls >= 1), timeout=30, what="the LLM asked")
                first.kill()  # while its reply is on the way
            finally:
                first.stop()
            await wait_committed(s.nats.url, cairo)
            assert not await derived(s, APP, "u1")
            second = WorkerProcess(s, tmp_path / "facts-2.log", kind="facts", env=env).start().wait_ready()
            try:
                await settled(s, APP, "u1", cairo, timeout=60)
                facts = await live_facts(s, APP, "u1")
            finally:
                second.stop()
    assert sorted(f.statement for f in facts.values()) == ["The user likes maps.", "The user lives in Cairo."]
    assert all(f.revision == 1 for f in facts.values())  # written once each


async def test_a_changed_prompt_builds_a_generation_with_no_gap_in_reads(nats_url, sqlite_url, tmp_path, brain):
    b = brain()
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url)
    async with running_worker(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            for i in range(12):
                last = await client.append("u1", f"s{i}", said("user", f"I like topic{chr(97 + i)}."))
            async with running(FactWorker(s)):
                await settled(s, APP, "u1", last, timeout=60)
            first = await live_facts(s, APP, "u1")
            assert len(first) == 12
            b.delay_s = 0.05  # a build that takes a while
            s2 = fact_settings(nats_url, sqlite_url, tmp_path, b.url, llm={"model": "brain-2"})
            seen: list[int] = []
            async with running(FactWorker(s2)) as second:
                while not second.stats.promoted:
                    seen.append(len(await live_facts(s, APP, "u1")))
                    await asyncio.sleep(0.02)
                after = await live_facts(s, APP, "u1")
    assert seen and min(seen) == 12  # every read during the build found the old generation whole
    assert sorted(f.statement for f in after.values()) == sorted(f.statement for f in first.values())
    engine = create_engine(s.database_url())
    try:
        async with engine.connect() as conn:
            gens = await store.generations(conn)
    finally:
        await engine.dispose()
    assert [g.state for g in gens] == ["live"] and gens[0].name == second.stats.promoted[0]


async def test_facts_are_off_without_an_endpoint(nats_url, sqlite_url, tmp_path):
    s = make_settings(nats_url, sqlite_url, tmp_path)
    async with running_worker(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            await client.append("u1", "s1", said("user", "I live in Paris."))
            await asyncio.sleep(0.5)
    assert not worker.enabled and worker.stats.batches == 0
    assert await live_facts(s, APP, "u1") == {}


async def test_the_real_model_yields_facts_citing_the_session_s_events(nats_url, sqlite_url, tmp_path, llama_server):
    s = fact_settings(
        nats_url,
        sqlite_url,
        tmp_path,
        llama_server.url,
        response_format="json_object",
        llm={"model": LlamaServer.model, "temperature": 0.0, "max_tokens": 200, "api_key": "sk-local"},
    )
    async with running_worker(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seqs = [
                await client.append("caroline", "s1", said("user", "Hi! I'm Caroline. I moved to Denver in May.")),
                await client.append("caroline", "s1", said("assistant", "Welcome to Denver, Caroline!")),
                await client.append("caroline", "s1", said("user", "I also adopted a dog called Rex.")),
            ]
            await settled(s, APP, "caroline", seqs[-1], timeout=120)
            facts = await live_facts(s, APP, "caroline")
    # A 270M model: its facts are crude, or it may dead-letter a reply that
    # breaks the schema; either way nothing is silent and every source is real.
    assert facts or worker.stats.dead_lettered, "no fact and no dead letter"
    for f in facts.values():
        assert f.statement.strip() and f.sources and {src.seq for src in f.sources} <= set(seqs)


async def test_a_down_endpoint_holds_the_worker_and_nothing_is_skipped(nats_url, sqlite_url, tmp_path, brain):
    b = brain()
    answer = b.answer
    down = True

    def flaky(body: dict) -> tuple[int, dict, object]:
        return (503, {}, {"error": {"message": "overloaded"}}) if down else answer(body)

    b.stub.script = flaky
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url)
    async with running_worker(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seq = await client.append("u1", "s1", said("user", "I live in Quito."))
            await wait_committed(nats_url, seq)
            await wait_for(lambda: asyncio.sleep(0, worker.stats.failures >= 2), timeout=30, what="failed asks")
            assert not await derived(s, APP, "u1")  # held, not skipped
            assert worker.stats.dead_lettered == 0
            down = False
            await settled(s, APP, "u1", seq)
            facts = await live_facts(s, APP, "u1")
            nc = await nats.connect(nats_url)
            try:
                instances = [i for i in await discover_instances(nc) if i.name == "memq-facts"]
            finally:
                await nc.close()
    assert [f.statement for f in facts.values()] == ["The user lives in Quito."]
    # `memq status` shows the replica's spending and lag
    assert len(instances) == 1 and instances[0].data["llm_calls"] >= 1
    assert instances[0].data["failures"] >= 2 and "generation" in instances[0].data


async def test_an_app_over_its_token_budget_waits(nats_url, sqlite_url, tmp_path, brain):
    b = brain()
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url, tokens_per_minute=1)
    original = b.answer

    def with_usage(body: dict) -> tuple[int, dict, object]:
        status, headers, reply = original(body)
        return status, headers, {**reply, "usage": {"prompt_tokens": 50, "completion_tokens": 10}}

    b.stub.script = with_usage
    async with running_worker(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            first = await client.append("u1", "s1", said("user", "I live in Lima."))
            await settled(s, APP, "u1", first)
            second = await client.append("u1", "s2", said("user", "I like jazz."))
            await wait_committed(nats_url, second)
            await asyncio.sleep(1.5)  # several sweeps: the app spent its minute's budget
            assert not await derived(s, APP, "u1")
            calls = b.calls
            other = await client.append("u2", "s1", said("user", "I like tea."))  # the same app: also waits
            await wait_committed(nats_url, other)
            await asyncio.sleep(0.6)
            assert b.calls == calls
    assert worker.stats.tokens_in == 50 and worker.stats.tokens_out == 10


async def test_the_real_model_s_facts_go_with_their_turns_and_a_rebuild_finds_none(
    nats_url, sqlite_url, tmp_path, llama_server
):
    # Whatever a 270M model extracts, forgetting every turn it read must leave no fact, then or after a rebuild.
    llm = {"model": LlamaServer.model, "temperature": 0.0, "max_tokens": 200, "api_key": "sk-local"}
    s = fact_settings(nats_url, sqlite_url, tmp_path, llama_server.url, response_format="json_object", llm=llm)
    async with running_worker(s), running_query(s):
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            seqs = [
                await client.append("rex", "s1", said("user", "My name is Ana and I live in Porto.")),
                await client.append("rex", "s1", said("user", "I work as a baker and I love surfing.")),
            ]
            async with running(FactWorker(s)) as worker:
                await settled(s, APP, "rex", seqs[-1], timeout=120)
                made = await live_facts(s, APP, "rex")
                assert made or worker.stats.dead_lettered, "no fact and no dead letter"
                for seq in seqs:
                    await client.forget_event("rex", "s1", seq)

                async def none_left() -> bool:
                    return await live_facts(s, APP, "rex") == {}

                await wait_for(none_left, timeout=60, what="every fact of the forgotten turns gone")
            s2 = fact_settings(
                nats_url,
                sqlite_url,
                tmp_path,
                llama_server.url,
                response_format="json_object",
                llm={**llm, "max_tokens": 201},  # another fingerprint: a new generation, replayed from SQL
            )
            async with running(FactWorker(s2)) as rebuilt:
                await wait_for(lambda: asyncio.sleep(0, bool(rebuilt.stats.promoted)), timeout=60, what="rebuild")
            assert await live_facts(s2, APP, "rex") == {}
            assert rebuilt.stats.llm_calls == 0  # nothing left to read


async def test_a_turn_forgotten_while_the_llm_reads_it_never_becomes_a_fact(nats_url, sqlite_url, tmp_path, brain):
    b = brain(delay_s=1.5)
    s = fact_settings(nats_url, sqlite_url, tmp_path, b.url)
    async with running_worker(s), running_query(s), running(FactWorker(s)) as worker:
        async with await MemoryClient.connect(nats_url, app=APP) as client:
            secret = await client.append("u1", "s1", said("user", "I live in Reykjavik."))
            await wait_for(lambda: asyncio.sleep(0, b.calls >= 1), timeout=30, what="the LLM asked")
            forgot = await client.forget_event("u1", "s1", secret)  # while the reply is on the way
            await settled(s, APP, "u1", forgot)
            await asyncio.sleep(0.5)
            assert await live_facts(s, APP, "u1") == {}
    engine = create_engine(s.database_url())
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(models.FACT_REVISIONS))).scalar_one()
    finally:
        await engine.dispose()
    assert rows == 0
    assert worker.stats.facts_changed == 0 and b.calls == 1  # never written (then removed), and not asked again

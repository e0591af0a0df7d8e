"""How the query worker names what is unavailable (no servers needed)."""

from __future__ import annotations

import nats.errors
import orjson
from fakes import query_live
from sqlalchemy import exc as sa_exc

from memq.contracts import queries as q
from memq.workers.query.worker import QueryWorker
from memq.workers.settings import Settings


class FailingFloor:
    value = 0

    def __init__(self, exc: Exception):
        self.exc = exc

    async def wait_for(self, seq: int, timeout_s: float) -> None:
        raise self.exc


async def answer_with(exc: Exception, tmp_path) -> dict:
    worker = QueryWorker(Settings(data_dir=tmp_path, database={"url": "inmemory"}))
    worker._live = query_live(FailingFloor(exc))
    req = q.HistoryGet(app="a", user="u", session="s", min_seq=5)
    body, _ = await worker._answer("history", req, None, worker.slots.admit("a", "history"))
    return orjson.loads(body)["error"]


async def test_a_jetstream_timeout_is_not_blamed_on_the_database(tmp_path):
    # nats-py's TimeoutError is an asyncio.TimeoutError too.
    error = await answer_with(nats.errors.TimeoutError(), tmp_path)
    assert error == {"code": "unavailable", "message": "history: JetStream is unavailable, retry later"}


async def test_a_database_outage_says_database(tmp_path):
    error = await answer_with(sa_exc.OperationalError("SELECT 1", {}, OSError("connection refused")), tmp_path)
    assert error == {"code": "unavailable", "message": "history: the database is unavailable, retry later"}


class StartingUp(Exception):
    """What asyncpg's adapted error carries for "the database system is
    starting up" (CannotConnectNowError, SQLSTATE 57P03)."""

    sqlstate = "57P03"


async def test_a_database_starting_up_is_unavailable_not_internal(tmp_path):
    # Right after a PostgreSQL restart SQLAlchemy raises this as a plain
    # DBAPIError (neither Operational nor Interface): it was answered "internal".
    exc = sa_exc.DBAPIError("SELECT 1", {}, StartingUp("the database system is starting up"))
    error = await answer_with(exc, tmp_path)
    assert error == {"code": "unavailable", "message": "history: the database is unavailable, retry later"}


async def test_a_bad_statement_is_still_internal(tmp_path):
    class Syntax(Exception):
        sqlstate = "42601"

    error = await answer_with(sa_exc.DBAPIError("SELEC 1", {}, Syntax("syntax error")), tmp_path)
    assert error["code"] == "internal"

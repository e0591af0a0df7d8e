"""Error messages that leave the server carry no server path, URL, password
or internal host (issue 32): the redactor, and the two places it is applied
(the query worker's error replies and the HTTP gateway's error answers)."""

from __future__ import annotations

import httpx
import pytest

from memq.contracts.errors import Conflict, Unavailable
from memq.contracts.replies import parse_reply
from memq.workers import redact as redact_module
from memq.workers.http.api import build_api
from memq.workers.http.keys import Keyring
from memq.workers.redact import SERVER, SERVER_PATH, Redactor, internals
from memq.workers.settings import Settings

DSN = "postgresql+asyncpg://memq:s3cret-pw@pg.internal:5432/memq"


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(
        data_dir=tmp_path / "memq data",  # a space: the shape of a path alone would not cover it
        database={"url": DSN},
        indexing={"weaviate": {"url": "http://weaviate.svc.cluster:8080", "api_key": "wv-key-123"}},
    )


@pytest.mark.parametrize(
    "message, hidden",
    [
        ("no index generation 'g1' in {data}/index.db", "{data}"),
        ("cannot connect to pg.internal: refused", "pg.internal"),
        ("password authentication failed (s3cret-pw)", "s3cret-pw"),
        (f"bad url {DSN}", "s3cret-pw"),
        ("Weaviate at http://weaviate.svc.cluster:8080: timed out", "weaviate.svc.cluster"),
        ("Weaviate at weaviate.svc.cluster port 50051", "weaviate.svc.cluster"),
        ("auth failed with key wv-key-123", "wv-key-123"),
    ],
)
def test_the_settings_own_values_are_hidden(settings, message, hidden):
    redact = Redactor.for_settings(settings)
    data = str(settings.data_dir)
    scrubbed = redact(message.format(data=data))
    assert hidden.format(data=data) not in scrubbed
    assert SERVER in scrubbed or SERVER_PATH in scrubbed


@pytest.mark.parametrize(
    "message",
    [
        "file /var/lib/memq/index.db is locked",
        "open ~/.memq/x.db failed",
        r"cannot open C:\memq\index.db",
        "connect to redis://cache.prod:6379/0 failed",
        "host 10.0.3.7:5432 refused",
    ],
)
def test_shapes_of_paths_urls_and_addresses_are_hidden_without_settings(message):
    scrubbed = Redactor()(message)
    assert not any(part in scrubbed for part in ("/var/lib", ".memq", "memq\\", "cache.prod", "10.0.3.7")), scrubbed


@pytest.mark.parametrize(
    "message",
    [
        "session 'a/b' not found",
        "request body must be a JSON object",
        "invalid search request: k: Input should be less than or equal to 100",
        "expected application/json",
        "min_seq 1234 was not committed within 50 ms",
    ],
)
def test_ordinary_messages_are_left_alone(settings, message):
    assert Redactor.for_settings(settings)(message) == message


class CountingRedactor(Redactor):
    """A redactor that counts its real scrubs."""

    scrubs = 0

    def _scrub(self, message: str) -> str:
        self.scrubs += 1
        return super()._scrub(message)


def test_a_repeated_message_is_scrubbed_once_with_the_same_result(settings):
    redact = CountingRedactor.for_settings(settings)
    message = f"no index in {settings.data_dir}/index.db"
    first = redact(message)
    assert redact(message) == first == Redactor.for_settings(settings)(message)
    assert SERVER_PATH in first and redact.scrubs == 1
    assert redact("another message") == "another message" and redact.scrubs == 2


def test_the_memo_stays_bounded_and_long_messages_are_scrubbed_each_time(settings):
    redact = CountingRedactor.for_settings(settings)
    for n in range(redact_module.MEMO + 5):
        assert redact(f"refusal {n} at 10.0.3.7") == f"refusal {n} at {SERVER}"
    assert len(redact._memo) <= redact_module.MEMO
    long = "x" * (redact_module.MEMO_CHARS + 1) + " 10.0.3.7"
    scrubs = redact.scrubs
    assert redact(long) == redact(long) and SERVER in redact(long)
    assert redact.scrubs == scrubs + 3 and long not in redact._memo


def test_every_secret_and_path_of_the_settings_is_found(settings):
    found = internals(settings)
    assert {str(settings.data_dir), "s3cret-pw", "pg.internal", DSN, "wv-key-123", "weaviate.svc.cluster"} <= found


def test_the_query_worker_replies_with_the_scrubbed_message_and_logs_the_full_one(settings, caplog):
    from memq.workers.query.worker import QueryWorker

    worker = QueryWorker(settings)
    path = f"{settings.data_dir}/index.db"
    body = worker._refusal("search", Unavailable(f"search: the index is unavailable ({path}: disk I/O error)"))
    with pytest.raises(Unavailable) as caught:
        parse_reply("search", body)
    assert str(settings.data_dir) not in caught.value.message and "disk I/O error" in caught.value.message
    assert any(path in r.getMessage() for r in caplog.records), "the full message is not in the log"
    # the error keeps its type and what it carries besides the message
    conflict = Conflict(f"conflict in {path}", last_seq=7)
    assert parse_reply_error(worker._refusal("events", conflict)) == ("conflict", f"conflict in {SERVER_PATH}")
    assert conflict.message.endswith(path)  # the original is not changed


def parse_reply_error(body: bytes) -> tuple[str, str]:
    import orjson

    error = orjson.loads(body)["error"]
    return error["code"], error["message"]


class Failing:
    """A client whose every search fails as a gateway's own NATS client may."""

    async def search(self, *args, **kwargs):
        raise Unavailable("request to memq.v1.q.app.search failed: NoServersError: nats://nats.internal:4222")


async def test_the_gateway_answers_memq_errors_scrubbed():
    api = build_api(Keyring({}), lambda app: Failing())  # type: ignore[arg-type,return-value]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gw") as http:
        r = await http.get("/v1/apps/app/users/u/search", params={"q": "tea"})
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "nats.internal" not in message and "request to memq.v1.q.app.search failed" in message

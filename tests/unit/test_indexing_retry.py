"""The indexing worker hands a batch back as soon as the index answers
again, not when the retry delay has passed (up to 30 s by default)."""

from __future__ import annotations

import time

from fakes import FakeMsg

from memq.workers.index.backends.base import IndexMeta, IndexUnavailable
from memq.workers.indexing.worker import IndexingLive, IndexingWorker
from memq.workers.settings import Settings

DELAY_S = 20.0
META = IndexMeta(generation="g1", model="m", dim=4, created_at=1.0)


class ComesBack:
    """An index that is down for its first ``down`` liveness checks."""

    def __init__(self, down: int):
        self.down = down
        self.checks = 0

    async def live(self) -> IndexMeta:
        self.checks += 1
        if self.checks <= self.down:
            raise IndexUnavailable("connection refused")
        return META


async def test_a_batch_goes_back_once_the_index_answers():
    settings = Settings(indexing={"retry_delays_s": [DELAY_S], "ack_wait_s": 4 * DELAY_S})
    index = ComesBack(down=3)
    worker = IndexingWorker(settings)
    # Its running parts as open() would make them; one batch needs only the index.
    worker._live = IndexingLive(nc=None, js=None, backend=index, embedder=None, indexer=None)  # type: ignore[arg-type]
    worker._generation = META
    msgs = [FakeMsg(), FakeMsg()]
    t0 = time.monotonic()

    async def down(_: object) -> None:
        raise IndexUnavailable("connection refused")

    await worker._policy.run(msgs, down)  # type: ignore[arg-type]
    took = time.monotonic() - t0
    assert index.checks >= 4  # asked until it answered
    assert [m.naks for m in msgs] == [[0.0], [0.0]]  # redelivered at once
    assert took < DELAY_S / 2, f"held the batch {took:.1f}s"


def test_a_batch_holding_a_message_delivered_before_is_rewritten():
    from memq.workers.indexing.indexer import redelivered

    first, again = FakeMsg(), FakeMsg()
    again.metadata.num_delivered = 2
    assert not redelivered([first])
    assert redelivered([first, again])


def test_the_clients_own_batch_retries_are_counted():
    # weaviate-client resends an UNAVAILABLE batch by itself and only logs it;
    # the backend must know, since the first send may have been half-applied.
    import logging

    from memq.workers.index.backends import weaviate

    before = weaviate._BatchRetries.count
    logging.getLogger("weaviate-client").info("Batch objects received exception: <AioRpcError>. Retrying")
    logging.getLogger("weaviate-client").info("Searching in collection C received exception: <AioRpcError>")
    assert weaviate._BatchRetries.count == before + 1

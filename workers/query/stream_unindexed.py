"""A search that does not wait behind other apps' backlog: the caller's
memories the index has not reached yet, read from the stream.

Every app's messages share one stream and one indexing consumer, in stream
order: while app A has 20,000 events waiting to be indexed, app B's search
that waits for its own write (``min_seq``) waits for A's 20,000 too. So a
search whose ``min_seq`` is above the indexing floor first reads the
messages of its own user scope between the floor and ``min_seq``, with an
ephemeral consumer filtered to the user's subjects (the server skips every
other message, and its pending count says at once how many there are); it
makes them the docs the indexer will make (:mod:`memq.workers.memory.unindexed`,
each with its previous turn from SQL, once persistence has committed them)
and the searcher ranks them with the index's hits.

It waits for the indexer after all (raises :class:`MustWait`, with how many
messages of the caller's own wait) when the caller's own tail is longer than
``query.search_tail``, or removes memories. That is the caller's own
backlog: the error it gets then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from memq.contracts import queries as q
from memq.contracts.codec import decode_from_subject
from memq.contracts.errors import MemqError, NotCommitted
from memq.contracts.ids import scope_key
from memq.contracts.schemas import EventAppended, StreamMessage
from memq.contracts.subjects import user_events_filter
from memq.workers.index.previous import PreviousTurns
from memq.workers.memory.recall import Doc, StorageScope
from memq.workers.memory.tail import MustWait
from memq.workers.memory.unindexed import tail_docs
from memq.workers.runtime.commit_floor import CommitFloor
from memq.workers.status import duration

log = logging.getLogger("memq.query")


class OwnBacklog(MustWait):
    """The caller's own messages waiting to be indexed are more than a
    search adds itself: it waits for the indexer. ``waiting``: how many."""

    def __init__(self, waiting: int, limit: int):
        super().__init__(f"{waiting} of the user's messages wait to be indexed (more than {limit})")
        self.waiting = waiting


class Unindexed:
    """Reads a search's unindexed tail (see the module doc).

    :param floor: the persistence commit floor: a doc's previous turn is read
        from SQL once every message up to the tail's last is committed.
    :param limit: the most messages of the caller's own a search reads so
        (``query.search_tail``); 0: every search waits for the indexer.
    """

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        engine,
        floor: CommitFloor,
        *,
        scope: StorageScope,
        context: bool,
        limit: int,
        max_bytes: int,
    ):
        self.js, self.stream = js, stream
        self.floor = floor
        self.previous = PreviousTurns(engine, lambda _app: floor, scope) if context else None  # one stream's
        self.scope = scope
        self.limit = limit
        self.max_bytes = max_bytes

    async def docs(self, req: q.Search, after: int, deadline: float) -> list[Doc]:
        """The docs of ``req``'s user scope in (``after``, ``req.min_seq``]
        (``after``: the indexing floor known now), by ``deadline``
        (``time.monotonic()``). Raise :class:`MustWait` (or
        :class:`OwnBacklog`) when the search must wait for the indexer,
        :class:`NotCommitted` when persistence has not reached them by then."""
        upto = req.min_seq or 0
        if self.limit <= 0:
            raise MustWait("query.search_tail is 0")
        items = await self._messages(req.app, req.user, after, upto, deadline)
        previous = None
        if self.previous is not None:
            firsts: dict[str, tuple[int, EventAppended]] = {}
            for seq, message in items:
                if isinstance(message, EventAppended):
                    firsts.setdefault(scope_key(message.app, message.user, message.session), (seq, message))
            if firsts:
                # The turn before each session's first event is in SQL once
                # all up to it is committed: the persistence floor is waited
                # for here, as every read-your-writes read waits for it.
                await self.floor.wait_for(max(seq for seq, _ in firsts.values()), _left(deadline))
                previous = await self.previous.before(firsts)
        return tail_docs(items, self.scope, previous)

    async def _messages(
        self, app: str, user: str, after: int, upto: int, deadline: float
    ) -> list[tuple[int, StreamMessage]]:
        """The decoded messages on the user's subjects in (``after``, ``upto``]."""
        config = ConsumerConfig(
            filter_subjects=user_events_filter(app, user),
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after + 1,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=10.0,  # the server drops it if the delete below is lost
            mem_storage=True,
            num_replicas=1,
        )
        info = await self.js.add_consumer(self.stream, config)
        try:
            waiting = info.num_pending or 0  # from after + 1 to the stream's end: the caller's own
            if waiting > self.limit:
                raise OwnBacklog(waiting, self.limit)
            if not waiting:
                return []
            sub = await self.js.pull_subscribe_bind(consumer=info.name, stream=self.stream)
            try:
                msgs: list[Msg] = []
                while len(msgs) < waiting and (not msgs or msgs[-1].metadata.sequence.stream < upto):
                    try:
                        msgs += await sub.fetch(waiting - len(msgs), timeout=max(0.05, _left(deadline)))
                    except (TimeoutError, NatsTimeout):
                        raise NotCommitted(f"sequence {upto} could not be read from the stream in time") from None
            finally:
                with contextlib.suppress(NatsError):
                    await sub.unsubscribe()
        finally:
            with contextlib.suppress(NatsError, asyncio.TimeoutError):
                await self.js.delete_consumer(self.stream, info.name)
        items: list[tuple[int, StreamMessage]] = []
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq > upto:
                break
            try:
                items.append((seq, decode_from_subject(msg.subject, msg.data, max_bytes=self.max_bytes)))
            except MemqError:
                pass  # the indexer skips it too (persistence dead-letters it)
            except Exception as exc:  # a decoder bug: what the indexer does with it is unknown here
                raise MustWait(f"seq {seq} did not decode ({type(exc).__name__})") from None
        return items


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def index_behind(floor: CommitFloor, seq: int, waited_s: float, own: int | None, limit: int) -> str:
    """What a search that waited for the index in vain is told: how far the
    index is behind (stream order: every app's messages before ``seq``), when
    it may catch up at its recent rate, whose backlog it is (``own``: the
    caller's messages waiting, when known), and what to do."""
    ahead = seq - floor.value
    rate = floor.rate()
    eta = f", about {duration(ahead / rate)} at {rate:.0f}/s" if rate > 0 else ", and it has not moved lately"
    text = f"sequence {seq} is not indexed yet after {waited_s:.1f}s: the index is at {floor.value}, {ahead} messages behind{eta}"
    if own is not None:
        text += f"; {own} of them are this user's own, more than a search adds without the index (query.search_tail = {limit})"
    return text + "; retry later, or search what is indexed now without min_seq (min_seq=0; `memq search --min-seq 0`)"

"""Fakes that more than one test file uses (docs/contributing.md, "Where a
test goes"); a fake only one file needs stays in that file. Imported by name,
as helpers.py is: ``from fakes import FakeMsg``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class FakeMsg:
    """A JetStream message: its stream sequence and delivery count, and the
    naks (with their delays) and acks it got."""

    def __init__(self, seq: int = 1, delivered: int = 1):
        self.metadata = SimpleNamespace(num_delivered=delivered, sequence=SimpleNamespace(stream=seq))
        self.naks: list[float | None] = []
        self.acks = 0

    async def nak(self, delay: float | None = None) -> None:
        self.naks.append(delay)

    async def ack(self) -> None:
        self.acks += 1


class FakeNats:
    """A connected nats-py client as :class:`~memq.contracts.client.MemoryClient`
    uses one: its JetStream context is ``js``, and no error so far."""

    max_payload = 1 << 20
    last_error = None

    def __init__(self, js: Any = None):
        self.js = js

    def jetstream(self, timeout: float | None = None) -> Any:
        return self.js

    def new_inbox(self) -> str:
        return "_INBOX.x"


class Written:
    """The events stream's end (``StreamEnd``) when its last sequence is past
    every ``min_seq`` a test asks for."""

    last = 1_000

    async def reaches(self, seq: int) -> bool:
        return seq <= self.last

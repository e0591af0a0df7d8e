"""Fakes that more than one test file uses (docs/contributing.md, "Where a
test goes"); a fake only one file needs stays in that file. Imported by name,
as helpers.py is: ``from fakes import FakeMsg``."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any


class FakeMsg:
    """A JetStream message: its stream sequence and delivery count, and the
    naks (with their delays) and acks it got."""

    def __init__(self, seq: int = 1, delivered: int = 1, stream: str = "MEMQ_EVENTS"):
        self.metadata = SimpleNamespace(num_delivered=delivered, sequence=SimpleNamespace(stream=seq), stream=stream)
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


class ChatStub:
    """An HTTP server on 127.0.0.1 answering ``POST .../chat/completions`` from a script
    of ``(status, headers, body)``; records each request's headers and JSON body."""

    def __init__(self, script: list[tuple[int, dict, object]] | Callable[[dict], tuple[int, dict, object]]):
        self.script = script if callable(script) else list(script)  # a function answers from the request body
        self.requests: list[tuple[dict, dict]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((dict(self.headers), body))
                status, headers, reply = stub.script(body) if callable(stub.script) else stub.script.pop(0)
                if reply == "ECHO":  # a careless server echoing what it was sent
                    reply = {"error": {"message": f"invalid: {self.headers['Authorization']}"}}
                data = json.dumps(reply).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(content) -> dict:
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }


def query_live(floor: Any, *, cache: Any = None, end: Any = None) -> Any:
    """A running query worker's parts with no connection: one events stream
    whose commit and index floors are ``floor`` (and its end ``end``: by
    default a ``Written`` stand-in, for requests that never ask it)."""
    from memq.workers.query.worker import QueryLive, StreamReads
    from memq.workers.settings import StreamSettings

    reads = StreamReads(floor, floor, None, None, Written() if end is None else end)  # type: ignore[arg-type]
    return QueryLive(None, None, None, None, cache, {"MEMQ_EVENTS": reads}, StreamSettings())  # type: ignore[arg-type]


LIVES = re.compile(r"\[(t\d+)\][^\n]*?\bI (?:live|moved) (?:in|to) ([A-Z]\w+)")
LIKES = re.compile(r"\[(t\d+)\][^\n]*?\bI like ([a-z]+)")
KNOWN = re.compile(r"\[(f\d+)\] (.*)")
TURN = re.compile(r"\[(t\d+)\] (?:\[[\d-]+\] )?(?:[^:\n]+: )?(.+)")
NAME = re.compile(r"\b[A-Z][a-z]+\b")


class FactBrain:
    """A fact worker's chat endpoint by rule, in place of a model: it extracts
    "lives in" and "likes" facts (``echo``: every turn, as said) and decides
    that a new place invalidates the old one; the first ``garbage`` replies
    are not JSON; ``delay_s`` holds each reply (a worker can be killed meanwhile)."""

    def __init__(self, garbage: int = 0, delay_s: float = 0.0, echo: bool = False):
        self.garbage, self.delay_s, self.echo, self.calls = garbage, delay_s, echo, 0
        self.stub = ChatStub(self.answer)
        self.url = self.stub.url

    def answer(self, body: dict) -> tuple[int, dict, object]:
        self.calls += 1
        time.sleep(self.delay_s)
        prompt = body["messages"][-1]["content"]
        if self.garbage > 0:
            self.garbage -= 1
            return 200, {}, completion("this is not json {")
        if prompt.startswith("Known facts"):
            return 200, {}, completion(json.dumps(self.decide(prompt)))
        if self.echo:
            said = TURN.findall(prompt)
            facts = [{"statement": text, "entities": NAME.findall(text), "sources": [label]} for label, text in said]
            return 200, {}, completion(json.dumps({"facts": facts}))
        facts = [
            {"statement": f"The user lives in {place}.", "entities": [place], "sources": [label]}
            for label, place in LIVES.findall(prompt)
        ] + [
            {"statement": f"The user likes {thing}.", "entities": [thing], "sources": [label]}
            for label, thing in LIKES.findall(prompt)
        ]
        return 200, {}, completion(json.dumps({"facts": facts}))

    @staticmethod
    def decide(prompt: str) -> dict:
        new = prompt.split("New fact: ", 1)[1].split("\n", 1)[0]
        known = KNOWN.findall(prompt.split("New fact:", 1)[0])
        if "lives in" in new:
            old = [label for label, statement in known if "lives in" in statement and statement != new]
            if old:
                return {"action": "invalidate", "merge_into": None, "invalidates": old}
        return {"action": "add", "merge_into": None, "invalidates": []}

    def close(self) -> None:
        self.stub.close()

"""The read deadline of the gateway's uvicorn (workers/http/uvicorn_server.py) on a
real uvicorn and loopback sockets: a request must *arrive* in time, and
nothing else is cut: not a slow answer, not a kept-alive connection between
requests, not pipelined requests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest
import uvicorn

from memq.workers.http.uvicorn_server import deadline_protocol

DEADLINE_S = 0.5
pytestmark = pytest.mark.timeout(60)


async def app(scope, receive, send):
    """Echoes the body's size; ``/slow`` answers after twice the deadline."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    if scope["path"] == "/slow":
        await asyncio.sleep(2 * DEADLINE_S)
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@contextlib.asynccontextmanager
async def serving():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(app, http=deadline_protocol(DEADLINE_S), lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


def request(path: str = "/", body: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)


async def answer(reader: asyncio.StreamReader) -> bytes:
    """One response: its status line's code and its body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    body = await reader.readexactly(length)
    return head.split(b" ", 2)[1] + b" " + body


async def closed_after(reader: asyncio.StreamReader) -> tuple[bytes, float]:
    """What the server sent before closing, and how long after now it closed."""
    started = time.monotonic()
    sent = await asyncio.wait_for(reader.read(), 10)
    return sent, time.monotonic() - started


async def test_a_slow_answer_is_not_cut():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("/slow", b"abc"))
        assert await answer(reader) == b"200 3"
        writer.close()


async def test_a_kept_connection_idle_between_requests_is_not_cut():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(3):
            writer.write(request(body=b"x" * 10))
            assert await answer(reader) == b"200 10"
            await asyncio.sleep(2 * DEADLINE_S)  # longer than the deadline, shorter than keep-alive's 5 s
        writer.close()


async def test_pipelined_requests_are_all_answered():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(body=b"a") + request("/slow", b"bb") + request(body=b"ccc"))
        assert [await answer(reader) for _ in range(3)] == [b"200 1", b"200 2", b"200 3"]
        writer.close()


async def test_a_body_in_time_is_read_however_it_trickles():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        whole = request(body=b"y" * 40)
        for i in range(0, len(whole), 8):
            writer.write(whole[i : i + 8])
            await asyncio.sleep(DEADLINE_S / 20)
        assert await answer(reader) == b"200 40"
        writer.close()


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # a connection that never sends
        b"POST / HTTP/1.1\r\nHost: t\r\n",  # headers that never end
        b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123",  # a body that never ends
    ],
    ids=["silent", "headers", "body"],
)
async def test_a_request_that_does_not_arrive_in_time_is_cut_with_408(sent):
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        got, after = await closed_after(reader)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert after < DEADLINE_S + 3
        writer.close()


async def test_the_second_request_of_a_connection_has_its_own_deadline():
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(body=b"z"))
        assert await answer(reader) == b"200 1"
        writer.write(b"POST / HTTP/1.1\r\nHost: t\r\n")  # then stalls: keep-alive's timer is cancelled by it
        got, after = await closed_after(reader)
        assert got.startswith(b"HTTP/1.1 408"), got
        assert after < DEADLINE_S + 3
        writer.close()

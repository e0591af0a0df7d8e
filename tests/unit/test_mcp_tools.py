"""The MCP tools without a stack (workers/mcp/tools.py): memq's errors become
tool errors with their code and message, arguments reach the client as the
contract names them, and `user` falls back to the server's user or asks for one."""

from __future__ import annotations

import pytest
from mcp import Client

from memq.contracts.errors import Conflict, NotFound, Unavailable
from memq.contracts.queries import SearchResults, SessionsPage
from memq.workers.mcp.server import build_server


class FakeClient:
    """Records each call; raises ``error`` when set."""

    def __init__(self, error: Exception | None = None):
        self.error = error
        self.calls: list[tuple[str, tuple, dict]] = []

    def _call(self, name: str, *args, **kwargs):
        self.calls.append((name, args, kwargs))
        if self.error is not None:
            raise self.error

    async def search(self, *args, **kwargs) -> SearchResults:
        self._call("search", *args, **kwargs)
        return SearchResults(results=[], mode="keyword")

    async def list_sessions(self, *args, **kwargs) -> SessionsPage:
        self._call("list_sessions", *args, **kwargs)
        return SessionsPage(sessions=[])

    async def append_text(self, *args, **kwargs) -> int:
        self._call("append_text", *args, **kwargs)
        return 7

    async def delete_session(self, *args, **kwargs) -> int:
        self._call("delete_session", *args, **kwargs)
        return 8

    async def forget_event(self, *args, **kwargs) -> int:
        self._call("forget_event", *args, **kwargs)
        return 9


def connect(fake: FakeClient, user: str | None = "ana") -> Client:
    return Client(build_server("app-a", lambda: fake, user))  # type: ignore[arg-type, return-value]


@pytest.mark.parametrize(
    "error",
    [
        NotFound("no session 's' of user 'ana' in app 'app-a'"),
        Conflict("the session moved on"),
        Unavailable("no query service answers"),
    ],
)
async def test_memq_errors_are_tool_errors_with_their_code_and_message(error):
    async with connect(FakeClient(error)) as mcp:
        for tool, arguments in (
            ("search_memory", {"query": "tea"}),
            ("remember", {"text": "tea"}),
            ("forget_session", {"session": "s"}),
            ("forget_memory", {"session": "s", "seq": 3}),
        ):
            result = await mcp.call_tool(tool, arguments)
            assert result.is_error
            assert result.content[0].text.endswith(f"{error.code}: {error.message}")


async def test_arguments_reach_the_client_as_the_contract_names_them():
    fake = FakeClient()
    async with connect(fake) as mcp:
        result = await mcp.call_tool("search_memory", {"query": "tea", "k": 3, "mode": "keyword", "session": "s1"})
        assert not result.is_error and result.structured_content == {
            "results": [],
            "mode": "keyword",
            "model": None,
            "note": None,
        }
        remembered = await mcp.call_tool("remember", {"text": "likes green tea"})
        assert remembered.structured_content == {"user": "ana", "session": "notes", "seq": 7}
        await mcp.call_tool("remember", {"text": "hi", "session": "s1", "role": "assistant", "user": "bob"})
        forgotten = await mcp.call_tool("forget_memory", {"session": "s1", "seq": 5})
        assert forgotten.structured_content == {"user": "ana", "session": "s1", "memory_seq": 5, "seq": 9}
        assert (await mcp.call_tool("forget_memory", {"session": "s1", "seq": 0})).is_error  # refused before memq
    assert fake.calls == [
        ("search", ("ana", "tea"), {"k": 3, "session": "s1", "mode": "keyword"}),
        ("append_text", ("ana", "notes", "user", "likes green tea"), {}),
        ("append_text", ("bob", "s1", "assistant", "hi"), {}),
        ("forget_event", ("ana", "s1", 5), {}),
    ]


async def test_without_a_default_user_a_call_must_name_one():
    fake = FakeClient()
    async with connect(fake, user=None) as mcp:
        result = await mcp.call_tool("list_sessions", {})
        assert result.is_error and "give `user`" in result.content[0].text
        assert not (await mcp.call_tool("list_sessions", {"user": "bob"})).is_error
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert "required" in tools["list_sessions"].input_schema["properties"]["user"]["description"]
    assert fake.calls == [("list_sessions", ("bob",), {"limit": 20, "cursor": None})]


async def test_a_bad_id_is_a_tool_error_not_a_crash():
    fake = FakeClient()
    async with connect(fake) as mcp:
        for arguments, field in (
            ({"session": ""}, "session"),
            ({"session": "s" * 300}, "session"),
            ({"session": "a\x00b"}, "session"),
            ({"session": "s", "user": ""}, "user"),
        ):
            result = await mcp.call_tool("forget_session", arguments)
            said = result.content[0].text
            assert result.is_error and f"invalid_request: argument `{field}`: " in said, (arguments, said)
            assert said.startswith("Error executing tool forget_session: ") and "\n" not in said, said
    assert fake.calls == []

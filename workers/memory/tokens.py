"""Exact, offline token counting with tiktoken (docs/design.md, Working memory and recall).

Nothing here downloads, nor touches a file: the encodings that load offline
come from :mod:`memq.workers.encodings` (packaged files, hash-checked and put
into tiktoken's cache), plugged in through :func:`use_offline_encodings`.
``cl100k_base`` is always among them. Models that need ``o200k_base`` (GPT-4o,
o1/o3, GPT-4.1, GPT-5) are counted exactly when it is available too, else
with ``cl100k_base``: an **approximation**, flagged by
:attr:`EncodingChoice.approximate` (typically within a few percent for
English, worse for other scripts). The same fallback applies to the
deprecated ``p50k``/``r50k``/``gpt2`` models.

Counting follows OpenAI's cookbook "How to count tokens with tiktoken": every
chat message costs ``tokens_per_message`` (3) plus the tokens of each of its
values, a ``name`` costs ``tokens_per_name`` (1) more, and every reply is
primed with 3 tokens (``<|start|>assistant<|message|>``). ``gpt-3.5-turbo-0301``
uses 4 and -1. Text is encoded with ``encode_ordinary``: user text containing
``<|endoftext|>`` is ordinary text to the API, and ``encode`` would raise.

Events are rendered as OpenAI chat messages by :func:`event_messages`; an
event's count (:func:`count_event`) is the count of those messages without the
reply priming, so ``sum(count_event(e) for e in events) + 3 ==
count_messages(all their messages)`` exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import tiktoken

# --- encodings ------------------------------------------------------------------

CL100K_BASE = "cl100k_base"
O200K_BASE = "o200k_base"
DEFAULT_ENCODING = CL100K_BASE

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>

# What loads without a network is I/O (packaged files, hash-checked and copied
# into tiktoken's cache): memq.workers.encodings knows, and memq.workers'
# __init__ plugs it in here, so this module stays pure.
_offline: Callable[[], frozenset[str]] | None = None


def use_offline_encodings(available: Callable[[], frozenset[str]]) -> None:
    """Count with the encodings ``available()`` names (called on first count;
    it must make them load offline). Forgets earlier choices."""
    global _offline
    _offline = available
    choose_encoding.cache_clear()
    encoding_for.cache_clear()
    _count_short.cache_clear()


def available_encodings() -> frozenset[str]:
    """Encodings that load without a network (installs them on first call)."""
    if _offline is None:
        raise RuntimeError("no offline encodings plugged in (see memq.workers.encodings)")
    return _offline()


# --- models -------------------------------------------------------------------


@dataclass(frozen=True)
class EncodingChoice:
    """Which encoding counts a model's tokens.

    Attributes:
        model: the model name asked for (``None``: memq's default).
        wanted: the encoding the model really uses (tiktoken's own model map;
            ``cl100k_base`` for unknown models and for ``None``).
        used: the encoding memq counts with.
        approximate: ``wanted != used``: counts are an approximation because
            ``wanted`` is not available offline.
    """

    model: str | None
    wanted: str
    used: str

    @property
    def approximate(self) -> bool:
        return self.wanted != self.used


def encoding_name_for(model: str | None) -> str:
    """The encoding a model uses, from tiktoken's model map (exact names such
    as ``gpt-4``, ``gpt-3.5-turbo``, ``text-embedding-3-small``, and prefixes
    such as ``gpt-4o-``, ``gpt-4.1-``, ``o3-``). Unknown models and ``None``
    get ``cl100k_base``, as Hector does."""
    if not model:
        return DEFAULT_ENCODING
    import tiktoken  # on the first count: every worker module imports this one (`memq --help` too)

    try:
        return tiktoken.encoding_name_for_model(model)
    except KeyError:
        return DEFAULT_ENCODING


@functools.lru_cache(maxsize=256)
def choose_encoding(model: str | None) -> EncodingChoice:
    """The :class:`EncodingChoice` for ``model`` (see the module docstring)."""
    wanted = encoding_name_for(model)
    used = wanted if wanted in available_encodings() else DEFAULT_ENCODING
    return EncodingChoice(model=model, wanted=wanted, used=used)


@functools.lru_cache(maxsize=256)
def encoding_for(model: str | None = None) -> tiktoken.Encoding:
    """The tiktoken encoding that counts ``model``'s tokens (cached).

    Parameters:
        model: an OpenAI model name, or ``None`` for ``cl100k_base``.
    """
    import tiktoken

    return tiktoken.get_encoding(choose_encoding(model).used)


def is_approximate(model: str | None) -> bool:
    """True when ``model``'s counts use a stand-in encoding (see module docstring)."""
    return choose_encoding(model).approximate


# --- counting -----------------------------------------------------------------


def count_text(text: str, model: str | None = None) -> int:
    """Tokens of ``text`` for ``model`` (default ``cl100k_base``), with
    ``encode_ordinary``: special-token text counts as ordinary text."""
    if not text:
        return 0
    if len(text) <= SHORT_TEXT:
        return _count_short(text, model)
    return len(encoding_for(model).encode_ordinary(text))


SHORT_TEXT = 32  # roles, names, ids: the same few strings in every message


@functools.lru_cache(maxsize=4096)
def _count_short(text: str, model: str | None) -> int:
    return len(encoding_for(model).encode_ordinary(text))


def _overhead(model: str | None) -> tuple[int, int]:
    # The cookbook's one exception; every current chat model uses 3 / 1.
    if model == "gpt-3.5-turbo-0301":
        return 4, -1
    return TOKENS_PER_MESSAGE, TOKENS_PER_NAME


def dumps(value: Any) -> str:
    """Compact, deterministic JSON (sorted keys; non-JSON values via ``str``)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str).decode()


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def count_messages(messages: Iterable[Mapping[str, Any]], model: str | None = None) -> int:
    """Prompt tokens of OpenAI chat ``messages`` ([{role, content, name?, ...}]),
    as the cookbook counts them, including the 3 reply-priming tokens.

    Parameters:
        messages: OpenAI chat messages.
        model: the model name (default ``None``: ``cl100k_base``, 3/1 overhead).

    The cookbook only covers string values. Here ``None`` values count 0 and
    other values (``tool_calls``) count as their compact sorted-keys JSON: a
    documented stand-in, since OpenAI does not publish how tool calls are
    rendered.
    """
    per_message, per_name = _overhead(model)
    total = REPLY_PRIMING
    for message in messages:
        total += per_message
        for key, value in message.items():
            if value is None:
                continue
            total += count_text(_value_text(value), model)
            if key == "name":
                total += per_name
    return total


def message_tokens(message: Mapping[str, Any], model: str | None = None) -> int:
    """Tokens of one chat message inside a list (without the reply priming)."""
    return count_messages((message,), model) - REPLY_PRIMING


# --- events as text and as chat messages --------------------------------------


def _parts(event: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    message = event.get("message")
    if not message:
        return []
    return list(message.get("parts") or ())


def _result_text(part: Mapping[str, Any]) -> str:
    text = _value_text(part.get("result"))
    return f"Error: {text}" if part.get("is_error") else text


def _part_text(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind == "text":
        return part.get("text") or ""
    if kind == "data":
        return dumps(part.get("data"))
    if kind == "tool_call":
        return f"{part.get('name', '')}({dumps(part.get('args') or {})})"
    if kind == "tool_result":
        return _result_text(part)
    if kind == "file":
        name = part.get("name") or ""
        uri = part.get("uri") or ""
        mime = part.get("mime_type") or "application/octet-stream"
        return f"[file: {name} ({mime}) {uri}]" if name else f"[file: ({mime}) {uri}]"
    return dumps(part)  # an unknown part type still shows, deterministically


def event_text(event: Mapping[str, Any]) -> str:
    """The text an event contributes to a prompt, for search and summaries.

    Parts in order, joined by newlines: text as is; data parts as compact
    sorted-keys JSON; tool calls as ``name({json args})``; tool results as
    their string, or compact JSON for other values (``Error: `` before an
    error); files as ``[file: name (mime) uri]``.
    """
    return "\n".join(_part_text(p) for p in _parts(event))


def event_time(event: Mapping[str, Any]) -> str | None:
    """The event's UTC date (``YYYY-MM-DD``), or None without a timestamp."""
    ts = event.get("timestamp")
    if not isinstance(ts, (int, float)):
        return None
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d")


def event_messages(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An event as OpenAI chat messages (usually one; see below).

    - text, data and file parts become ``content`` (see :func:`event_text`);
    - tool calls become the ``tool_calls`` of one ``assistant`` message
      (``content`` None when there is no other part);
    - each tool result becomes its own ``tool`` message with
      ``tool_call_id``, as OpenAI requires one per call;
    - role ``tool`` without results, which OpenAI would refuse, becomes
      ``user``.

    Order: results answering earlier calls, then the event's own message,
    then results answering calls made in this same event, so every ``tool``
    message follows its call. An event without a message renders nothing.
    No ``name`` is set (agents are not named in OpenAI messages).
    """
    message = event.get("message")
    if not message:
        return []
    role = message.get("role") or "user"
    parts: Sequence[Mapping[str, Any]] = message.get("parts") or ()
    if len(parts) == 1 and parts[0].get("type") == "text":
        # Most events: one text part, one message (what the loop below gives
        # it, without its lists and sets; a query renders every window event).
        return [{"role": "user" if role == "tool" else role, "content": parts[0].get("text") or ""}]
    calls: list[dict[str, Any]] = []
    results: list[Mapping[str, Any]] = []
    content: list[str] = []
    for part in parts:
        kind = part.get("type")
        if kind == "tool_call":
            calls.append(
                {
                    "id": part.get("id", ""),
                    "type": "function",
                    "function": {"name": part.get("name", ""), "arguments": dumps(part.get("args") or {})},
                }
            )
        elif kind == "tool_result":
            results.append(part)
        else:
            content.append(_part_text(part))
    own_call_ids = {c["id"] for c in calls}
    before = [r for r in results if r.get("id") not in own_call_ids]
    after = [r for r in results if r.get("id") in own_call_ids]

    def tool(part: Mapping[str, Any]) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": part.get("id", ""), "content": _result_text(part)}

    out = [tool(r) for r in before]
    text = "\n".join(content)
    if calls:
        out.append({"role": "assistant", "content": text if content else None, "tool_calls": calls})
    elif content or not results:
        out.append({"role": "user" if role == "tool" else role, "content": text})
    out.extend(tool(r) for r in after)
    return out


def count_event(event: Mapping[str, Any], model: str | None = None) -> int:
    """Tokens an event adds to a prompt: its :func:`event_messages` with
    OpenAI's per-message overhead (3 each, +1 per ``name``), without the
    reply priming. Summing these and adding 3 gives :func:`count_messages` of
    the whole list."""
    messages = event_messages(event)
    if not messages:
        return 0
    return count_messages(messages, model) - REPLY_PRIMING


def call_ids(event: Mapping[str, Any]) -> frozenset[str]:
    """Ids of the tool calls an event makes."""
    return frozenset(str(p.get("id", "")) for p in _parts(event) if p.get("type") == "tool_call")


def result_ids(event: Mapping[str, Any]) -> frozenset[str]:
    """Ids of the tool calls an event answers."""
    return frozenset(str(p.get("id", "")) for p in _parts(event) if p.get("type") == "tool_result")


NO_IDS: frozenset[str] = frozenset()


def tool_ids(event: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """``(call_ids(event), result_ids(event))`` in one pass over the parts,
    sharing one empty set for the events (most) that neither call nor answer."""
    calls: list[str] = []
    results: list[str] = []
    for p in _parts(event):
        kind = p.get("type")
        if kind == "tool_call":
            calls.append(str(p.get("id", "")))
        elif kind == "tool_result":
            results.append(str(p.get("id", "")))
    return (frozenset(calls) if calls else NO_IDS), (frozenset(results) if results else NO_IDS)


def count_texts(texts: Sequence[str], model: str | None = None) -> list[int]:
    """:func:`count_text` for many texts (one ``encode_ordinary`` each, which
    is faster than ``encode_batch`` for short texts)."""
    enc = encoding_for(model)
    return [len(enc.encode_ordinary(t)) if t else 0 for t in texts]

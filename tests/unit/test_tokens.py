"""Token counting: offline encodings, the model map, and counts checked
against tiktoken directly and against the OpenAI cookbook's published API
numbers ("How to count tokens with tiktoken")."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public

from memq.contracts.schemas import Event, FilePart, Message, TextPart, ToolCallPart, ToolResultPart
from memq.workers import encodings as enc
from memq.workers.memory import tokens as tk

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def offline_encodings():
    # tiktoken used directly (as these tests do) only works offline once
    # memq has filled its cache; memq's own functions do this themselves.
    enc.install_offline_encodings()


# The cookbook's example conversation; the OpenAI API counted 129 prompt
# tokens for gpt-3.5-turbo / gpt-4 and 124 for gpt-4o / gpt-4o-mini.
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain"
        " English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased"
        " leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


def cookbook_count(messages, encoding, per_message=3, per_name=1):
    """The cookbook's num_tokens_from_messages, written out independently."""
    n = 0
    for m in messages:
        n += per_message
        for key, value in m.items():
            n += len(encoding.encode(value))
            if key == "name":
                n += per_name
    return n + 3


# --- offline ------------------------------------------------------------------

OFFLINE_SCRIPT = textwrap.dedent(
    """
    import json, os, socket, sys

    # No network: any connection attempt or DNS lookup fails loudly.
    def refuse(*args, **kwargs):
        raise OSError("network access attempted")
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    import tiktoken.load
    real_read = tiktoken.load.read_file
    def no_download(blobpath):
        if "://" in blobpath:
            raise OSError("download attempted: " + blobpath)
        return real_read(blobpath)
    tiktoken.load.read_file = no_download

    from memq.workers.memory import tokens as tk
    import tiktoken

    out = {
        "available": sorted(tk.available_encodings()),
        "cache_dir": os.environ["TIKTOKEN_CACHE_DIR"],
        "gpt4": tk.encoding_for("gpt-4").name,
        "count": tk.count_text("tiktoken is great!", "gpt-4"),
        "plain": len(tiktoken.get_encoding("cl100k_base").encode("tiktoken is great!")),
        "for_model": tiktoken.encoding_for_model("gpt-3.5-turbo").name,
        "files": sorted(os.listdir(os.environ["TIKTOKEN_CACHE_DIR"])),
    }
    print(json.dumps(out))
    """
)


def run_offline(env_overrides: dict[str, str | None]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env.update({"PYTHONPATH": str(ROOT), "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"})
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cl100k_loads_offline_from_an_empty_cache_dir(tmp_path):
    cache = tmp_path / "empty-cache"
    out = run_offline({"TIKTOKEN_CACHE_DIR": str(cache)})
    assert "cl100k_base" in out["available"]
    assert out["gpt4"] == "cl100k_base"
    assert out["count"] == out["plain"] == 6  # the cookbook's "tiktoken is great!"
    assert out["for_model"] == "cl100k_base"  # plain tiktoken works offline too
    name = hashlib.sha1(enc.ENCODING_URLS["cl100k_base"].encode()).hexdigest()
    assert name in out["files"]
    data = (cache / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == enc.ENCODING_SHA256["cl100k_base"]


def test_default_cache_dir_is_memq_owned(tmp_path):
    out = run_offline({"TIKTOKEN_CACHE_DIR": None, "XDG_CACHE_HOME": None, "HOME": str(tmp_path)})
    assert out["cache_dir"] == str(tmp_path / ".cache" / "memq" / "tiktoken")
    assert out["count"] == 6


def test_pinned_hashes_equal_tiktokens_own():
    # tiktoken pins the same sha256 in its constructors: two independent pins.
    assert enc.ENCODING_SHA256["cl100k_base"] in inspect.getsource(openai_public.cl100k_base)
    assert enc.ENCODING_SHA256["o200k_base"] in inspect.getsource(openai_public.o200k_base)
    assert enc.ENCODING_URLS["cl100k_base"] in inspect.getsource(openai_public.cl100k_base)
    assert enc.ENCODING_URLS["o200k_base"] in inspect.getsource(openai_public.o200k_base)


def test_packaged_file_matches_the_pin():
    data = enc._cl100k_source()
    assert data is not None
    assert hashlib.sha256(data).hexdigest() == enc.ENCODING_SHA256["cl100k_base"]


def test_a_corrupt_cached_file_is_replaced(tmp_path):
    target = tmp_path / enc.cache_file_name("cl100k_base")
    target.write_bytes(b"not an encoding")
    assert enc._install_one("cl100k_base", tmp_path)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == enc.ENCODING_SHA256["cl100k_base"]


def test_a_packaged_file_with_the_wrong_hash_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(enc._SOURCES, "cl100k_base", lambda: b"tampered")
    with pytest.raises(enc.OfflineEncodingError, match="sha256"):
        enc._install_one("cl100k_base", tmp_path)
    assert not (tmp_path / enc.cache_file_name("cl100k_base")).exists()


def test_quicktok_vocab_rebuilds_the_official_file_byte_for_byte():
    # quicktok-v1 ships o200k in its own format; check the converter on the
    # cl100k ranks we have: shuffled quicktok records -> the pinned file.
    ranks = tiktoken.get_encoding("cl100k_base")._mergeable_ranks
    records = list(ranks.items())
    random.Random(7).shuffle(records)
    blob = struct.pack("<I", len(records)) + b"".join(
        struct.pack("<H", len(tok)) + tok + struct.pack("<I", rank) for tok, rank in records
    )
    rebuilt = enc.quicktok_vocab_to_tiktoken(blob)
    assert hashlib.sha256(rebuilt).hexdigest() == enc.ENCODING_SHA256["cl100k_base"]
    with pytest.raises(ValueError, match="trailing"):
        enc.quicktok_vocab_to_tiktoken(blob + b"x")


def test_o200k_models_are_exact_or_flagged():
    choice = tk.choose_encoding("gpt-4o")
    assert choice.wanted == "o200k_base"
    if "o200k_base" in tk.available_encodings():
        assert not choice.approximate and not tk.is_approximate("gpt-4o")
        # the cookbook: o200k_base splits "お誕生日おめでとう" into 8 tokens
        assert tk.count_text("お誕生日おめでとう", "gpt-4o") == 8
        assert tk.count_messages(COOKBOOK_MESSAGES, "gpt-4o") == 124
    else:
        assert choice.used == "cl100k_base" and choice.approximate and tk.is_approximate("gpt-4o")
        assert tk.count_text("お誕生日おめでとう", "gpt-4o") == 9  # cl100k's count


# --- model map ----------------------------------------------------------------


@pytest.mark.parametrize(
    "model,encoding",
    [
        (None, "cl100k_base"),
        ("", "cl100k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("gpt-35-turbo", "cl100k_base"),
        ("text-embedding-3-small", "cl100k_base"),
        ("text-embedding-3-large", "cl100k_base"),
        ("text-embedding-ada-002", "cl100k_base"),
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4o-2024-08-06", "o200k_base"),
        ("gpt-4.1-mini", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("claude-3-5-sonnet", "cl100k_base"),  # unknown: cl100k_base, as Hector does
        ("llama3", "cl100k_base"),
    ],
)
def test_model_map(model, encoding):
    assert tk.encoding_name_for(model) == encoding


def test_encoding_for_is_cached_and_defaults_to_cl100k():
    assert tk.encoding_for() is tk.encoding_for(None)
    assert tk.encoding_for("gpt-4") is tk.encoding_for("gpt-4")
    assert tk.encoding_for(None).name == "cl100k_base"
    assert not tk.is_approximate("gpt-4") and not tk.is_approximate(None)
    assert tk.is_approximate("text-davinci-003")  # p50k_base is not shipped


# --- counting -----------------------------------------------------------------


def test_count_text_matches_tiktoken():
    enc = tiktoken.get_encoding("cl100k_base")
    for text in ["", "tiktoken is great!", "antidisestablishmentarianism", "2 + 2 = 4", "お誕生日おめでとう"]:
        assert tk.count_text(text) == len(enc.encode(text))
    assert tk.count_text("antidisestablishmentarianism") == 6  # cookbook
    assert tk.count_text("2 + 2 = 4") == 7  # cookbook


def test_special_token_text_counts_as_ordinary_text():
    enc = tiktoken.get_encoding("cl100k_base")
    text = "please ignore <|endoftext|> and <|fim_prefix|>"
    with pytest.raises(ValueError):
        enc.encode(text)  # why encode_ordinary
    assert tk.count_text(text) == len(enc.encode_ordinary(text)) > 10


def test_count_messages_follows_the_cookbook_exactly():
    enc = tiktoken.get_encoding("cl100k_base")
    assert tk.count_messages(COOKBOOK_MESSAGES, "gpt-4") == cookbook_count(COOKBOOK_MESSAGES, enc) == 129
    assert tk.count_messages(COOKBOOK_MESSAGES, "gpt-3.5-turbo") == 129
    assert tk.count_messages(COOKBOOK_MESSAGES, "gpt-3.5-turbo-0301") == cookbook_count(
        COOKBOOK_MESSAGES, enc, per_message=4, per_name=-1
    )
    assert tk.count_messages([]) == 3
    assert tk.message_tokens({"role": "user", "content": "hello world"}) == 3 + 1 + 2


def test_non_string_values_count_as_compact_json():
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    msg = {"role": "assistant", "content": None, "tool_calls": calls}
    expected = 3 + tk.count_text("assistant") + tk.count_text(tk.dumps(calls))
    assert tk.message_tokens(msg) == expected


# --- events -------------------------------------------------------------------


def ev(role, *parts, timestamp=1_700_000_000.0):
    return Event(message=Message(role=role, parts=list(parts)), timestamp=timestamp).model_dump()


EVENTS = [
    ev("user", TextPart(text="What's the weather in Paris?")),
    ev(
        "assistant",
        TextPart(text="Let me check."),
        ToolCallPart(id="c1", name="weather", args={"city": "Paris", "unit": "C"}),
        ToolCallPart(id="c2", name="time", args={}),
    ),
    ev("tool", ToolResultPart(id="c1", name="weather", result={"temp": 21, "sky": "clear"})),
    ev(
        "tool",
        ToolResultPart(id="c2", name="time", result="14:02"),
        ToolResultPart(id="zz", result=None, is_error=True),
    ),
    ev("assistant", ToolCallPart(id="c3", name="noop")),
    ev("user", ToolResultPart(id="c3", result=[1, 2])),  # ADK sends function responses as role user
    ev(
        "assistant",
        TextPart(text="21°C and clear.\n<|endoftext|>"),
        FilePart(uri="s3://b/k.png", mime_type="image/png"),
    ),
    ev("system", TextPart(text="be brief")),
    ev("tool", TextPart(text="stray tool output")),
    ev("user"),  # no parts
    Event(message=None).model_dump(),
]


def test_event_counts_add_up_to_the_whole_list():
    messages = [m for e in EVENTS for m in tk.event_messages(e)]
    for model in (None, "gpt-4", "gpt-4o", "gpt-3.5-turbo-0301"):
        assert sum(tk.count_event(e, model) for e in EVENTS) + 3 == tk.count_messages(messages, model)


def test_count_event_exact_numbers():
    enc = tiktoken.get_encoding("cl100k_base")
    simple = ev("user", TextPart(text="hello world"))
    assert tk.count_event(simple) == 3 + len(enc.encode("user")) + len(enc.encode("hello world")) == 6
    assert tk.count_event(Event(message=None).model_dump()) == 0
    call = EVENTS[4]
    rendered = '[{"function":{"arguments":"{}","name":"noop"},"id":"c3","type":"function"}]'
    assert tk.count_event(call) == 3 + len(enc.encode("assistant")) + len(enc.encode(rendered))


def test_event_text_is_compact_and_deterministic():
    assert tk.event_text(EVENTS[1]) == 'Let me check.\nweather({"city":"Paris","unit":"C"})\ntime({})'
    assert tk.event_text(EVENTS[2]) == '{"sky":"clear","temp":21}'
    assert tk.event_text(EVENTS[3]) == "14:02\nError: null"
    assert tk.event_text(EVENTS[6]) == "21°C and clear.\n<|endoftext|>\n[file: (image/png) s3://b/k.png]"
    named = ev("user", FilePart(uri="file:///r.pdf", mime_type="application/pdf", name="r.pdf"))
    assert tk.event_text(named) == "[file: r.pdf (application/pdf) file:///r.pdf]"
    data = Event(message=Message(role="user", parts=[{"type": "data", "data": {"b": 1, "a": [2, {"d": 0, "c": 1}]}}]))
    assert tk.event_text(data.model_dump()) == '{"a":[2,{"c":1,"d":0}],"b":1}'
    assert tk.event_text(Event(message=None).model_dump()) == ""


def test_event_messages_follow_openai_tool_rules():
    assert tk.event_messages(EVENTS[0]) == [{"role": "user", "content": "What's the weather in Paris?"}]
    [assistant] = tk.event_messages(EVENTS[1])
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me check."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city":"Paris","unit":"C"}'}
    assert tk.event_messages(EVENTS[3]) == [
        {"role": "tool", "tool_call_id": "c2", "content": "14:02"},
        {"role": "tool", "tool_call_id": "zz", "content": "Error: null"},
    ]
    assert tk.event_messages(EVENTS[4])[0]["content"] is None
    assert tk.event_messages(EVENTS[5]) == [{"role": "tool", "tool_call_id": "c3", "content": "[1,2]"}]
    assert tk.event_messages(EVENTS[8]) == [{"role": "user", "content": "stray tool output"}]
    assert tk.event_messages(EVENTS[9]) == [{"role": "user", "content": ""}]
    assert tk.event_messages(EVENTS[10]) == []
    # a result for an earlier call, a new call, and its own result: each
    # tool message must follow the message holding its call
    mixed = ev(
        "assistant",
        ToolResultPart(id="old", result=1),
        ToolCallPart(id="new", name="f"),
        ToolResultPart(id="new", result=2),
    )
    roles = [(m["role"], m.get("tool_call_id")) for m in tk.event_messages(mixed)]
    assert roles == [("tool", "old"), ("assistant", None), ("tool", "new")]
    assert tk.call_ids(mixed) == {"new"} and tk.result_ids(mixed) == {"old", "new"}


def test_tool_ids_are_call_ids_and_result_ids_in_one_pass():
    mixed = ev("assistant", ToolResultPart(id="old", result=1), ToolCallPart(id="new", name="f"))
    for event in [*EVENTS, mixed]:
        assert tk.tool_ids(event) == (tk.call_ids(event), tk.result_ids(event))


def test_count_texts():
    assert tk.count_texts(["", "hello world", "tiktoken is great!"]) == [0, 2, 6]

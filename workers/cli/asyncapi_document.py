"""The AsyncAPI 3.0 document of memq: every subject an agent in any language
writes or reads, with the schema of what travels on it.

``memq asyncapi`` (or ``python -m memq.workers.cli.asyncapi_document``) writes it to
``contracts/asyncapi.json``, where it ships with the contracts package;
``--check`` fails when the committed file differs from a fresh one (CI runs
it through tests/unit/test_asyncapi.py).

The document describes the memq workers as one application ("receive": memq
reads it; "send": memq writes it). It is generated from the worker app
(:func:`memq.workers.runtime.app.build_app`, built with the default settings and
connected to nothing), so FastStream describes its own subscribers and
publishers: the commit notices and the status events, typed by
:mod:`memq.contracts.notices`. FastStream knows nothing of the rest, so
:func:`complete` adds it from :mod:`memq.contracts`:

- the event log (``memq.v1.ev.…``), read by the owned batch consumer and not
  by a FastStream subscriber: one message per stream-message kind, with the
  schema the JSON Schema files carry (:mod:`memq.contracts.jsonschema`);
- every query op (``memq.v1.q.<app>.<op>``), served by a nats micro service
  and not by FastStream, with its request and its reply: FastStream emits no
  AsyncAPI 3 ``reply`` objects, so these operations are written here, from
  the one op registry (:data:`memq.contracts.queries.OPS`);
- the dead-letter subjects (``memq.v1.dlq.<worker>``), published with
  JetStream directly, with their headers (:mod:`memq.contracts.dlq`);
- the query workers' side of the committed notices (the persistence
  replicas' and the indexing replicas'), nats-py subscriptions on the
  read-your-writes path (see :mod:`memq.workers.query.worker`).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import typing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from faststream.specification import AsyncAPI

import memq.contracts
from memq.contracts import dlq, jsonschema
from memq.contracts.queries import OPS
from memq.contracts.subjects import DLQ_STREAM, EVENTS_STREAM, PREFIX, committed_subject
from memq.workers.settings import Settings

DEFAULT_PATH = Path(memq.contracts.__file__).with_name("asyncapi.json")
COMMAND = "memq asyncapi"  # what a stale document asks to run
SCHEMAS = "#/components/schemas/"

TITLE = "memq"
DESCRIPTION = f"""\
Sessions and memory for LLM agents over NATS. An agent writes by publishing
stream messages on `{PREFIX}.ev.…` (captured by the JetStream stream
`{EVENTS_STREAM}`) and reads by NATS request/reply on `{PREFIX}.q.<app>.<op>`.

Every id in a subject is one subject token, escaped by
`memq.contracts.ids.encode_token`: an id of `[A-Za-z0-9_-]` only is
itself; any other is `~` followed by its UTF-8 bytes in unpadded
URL-safe base64. The ids in a body must be the ids of its subject.

A query may carry `min_seq` (the stream sequence of the caller's last
publish): it is answered once that sequence is committed, or fails with
`not_committed` after `wait_ms`. Every reply is `{{"ok": true, "result": …}}`
or `{{"ok": false, "error": {{"code", "message"}}}}`.

The JSON Schema of each payload also ships as files in the package
`memq.contracts` (schemas/, schemas/queries/).
"""

PARAMETERS = {
    "app": "the app id, as a subject token",
    "user": "the user id, as a subject token",
    "session": "the session id, as a subject token",
    "worker": "the worker kind that gave up on the message (e.g. persistence)",
}
EVENT_HEADERS = {
    "type": "object",
    "properties": {
        dlq.MSG_ID: {
            "type": "string",
            "description": "the message id (`event.id` for an event), escaped like a subject token: "
            "JetStream keeps one copy of a message published again within its duplicate window",
        },
        dlq.REPLAYED_FROM: {
            "type": "string",
            "description": f"only on a message replayed from {DLQ_STREAM} (`memq dlq replay`): its sequence there",
        },
    },
    "required": [dlq.MSG_ID],
}
DEAD_LETTER_HEADERS = {
    dlq.WORKER: "the worker kind that gave up on the message",
    dlq.ERROR_CODE: "why, as a code: one of memq.contracts.errors, or the worker's own (storage_rejected, duplicate_id)",
    dlq.ERROR: f"why, in words: one line of ASCII, at most {dlq.MAX_REASON} characters",
    dlq.ORIGINAL_SUBJECT: f"the subject the message had in {EVENTS_STREAM}; a replay publishes it there again",
    dlq.ORIGINAL_SEQ: f"its sequence in {EVENTS_STREAM}",
    dlq.MSG_ID: "`<worker>:<stream>:<seq>`: a message dead-lettered twice is stored once",
}
# The reply travels to the request's NATS reply subject (an inbox), which is
# not a header: the reply channel's address is dynamic (null).
REPLY_ADDRESS = (
    "the request's reply subject: a NATS inbox (an app's connections use `_INBOX_<app token>.…`, "
    "see memq.contracts.client.app_inbox_prefix)"
)


class DocumentSettings(Settings):
    """The default settings, whatever the environment or a config file says:
    the document describes memq, not this machine's deployment."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, **other_sources):
        return (init_settings,)


def package_version() -> str:
    try:
        return version("memq")
    except PackageNotFoundError:  # a source tree without an install
        return "0.0.0"


def document() -> dict[str, Any]:
    """The whole document, as JSON-ready data."""
    from memq.workers.runtime.app import build_app  # the worker runtime: only when a document is made

    with tempfile.TemporaryDirectory(prefix="memq-asyncapi-") as data_dir:
        settings = DocumentSettings(data_dir=Path(data_dir))
        broker = build_app(settings).broker
        assert broker is not None  # build_app always gives its app the broker
        spec = AsyncAPI(broker, title=TITLE, version=package_version(), description=DESCRIPTION, schema_version="3.0.0")
        generated = spec.to_specification().to_jsonable()
    return complete(generated, settings)


def complete(doc: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Add to FastStream's document what it cannot know (see the module
    doc), then give every channel address expression its parameter."""
    doc.setdefault("channels", {})
    doc.setdefault("operations", {})
    components = doc.setdefault("components", {})
    components.setdefault("schemas", {})
    components.setdefault("messages", {})
    server = [{"$ref": f"#/servers/{name}"} for name in doc.get("servers", {})]
    _add_events(doc, server)
    _add_queries(doc, server, settings)
    _add_dead_letters(doc, server)
    _add_commit_floor(doc, server, settings)
    _add_parameters(doc)
    components["schemas"] = _asyncapi_schemas(components["schemas"])
    return doc


# --- the event log -----------------------------------------------------------------


def _add_events(doc: dict[str, Any], server: list[dict[str, str]]) -> None:
    """Two channels, session and user scope, each with the kinds that go there."""
    scopes: dict[str, list[str]] = {"session": [], "user": []}
    for kind, cls in jsonschema.message_classes().items():
        name = _schema(doc, cls.__name__, jsonschema.message_schema(cls, ref_template=SCHEMAS + "{model}"))
        doc["components"]["messages"][f"event.{kind}"] = {
            "name": kind,
            "title": f"{kind} message",
            "summary": _first_paragraph(cls.__doc__),
            "contentType": "application/json",
            "headers": EVENT_HEADERS,
            "payload": {"$ref": SCHEMAS + name},
        }
        session = cls.model_fields.get("session")
        if session is not None:
            scopes["session"].append(kind)
        if session is None or not session.is_required():
            scopes["user"].append(kind)
    addresses = {"session": f"{PREFIX}.ev.{{app}}.{{user}}.{{session}}", "user": f"{PREFIX}.ev.{{app}}.{{user}}"}
    for scope, kinds in scopes.items():
        channel = f"events.{scope}"
        doc["channels"][channel] = {
            "address": addresses[scope],
            "title": f"{scope}-scoped stream messages",
            "description": f"Captured by the JetStream stream {EVENTS_STREAM}; the publish is acknowledged "
            "with the message's stream sequence (the `min_seq` of a later query). "
            f"Kinds: {', '.join(kinds)}.",
            "servers": server,
            "messages": {kind: {"$ref": f"#/components/messages/event.{kind}"} for kind in kinds},
        }
        doc["operations"][channel] = {
            "action": "receive",
            "title": f"Commit {scope}-scoped messages",
            "summary": "The workers commit the event log to SQL, index it and summarize it, in stream order.",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{kind}"} for kind in kinds],
        }


# --- queries ---------------------------------------------------------------------


def _add_queries(doc: dict[str, Any], server: list[dict[str, str]], settings: Settings) -> None:
    """One operation per op of the registry, with its request and its reply."""
    refs = SCHEMAS + "{model}"
    for name, op in OPS.items():
        request = _schema(doc, op.request.__name__, jsonschema.request_schema(name, ref_template=refs))
        reply = _schema(doc, f"{op.reply.__name__}Reply", jsonschema.reply_schema(name, ref_template=refs))
        messages = doc["components"]["messages"]
        messages[f"{name}.request"] = {
            "name": f"{name} request",
            "contentType": "application/json",
            "payload": {"$ref": SCHEMAS + request},
        }
        messages[f"{name}.reply"] = {
            "name": f"{name} reply",
            "contentType": "application/json",
            "payload": {"$ref": SCHEMAS + reply},
        }
        channel, reply_channel = f"q.{name}", f"q.{name}.reply"
        doc["channels"][channel] = {
            "address": f"{PREFIX}.q.{{app}}.{name}",
            "title": f"{name} requests",
            "description": "Core NATS request/reply, in no stream. The body names the app of the subject.",
            "servers": server,
            "messages": {"request": {"$ref": f"#/components/messages/{name}.request"}},
        }
        doc["channels"][reply_channel] = {
            "address": None,
            "title": f"{name} replies",
            "description": f"Dynamic: {REPLY_ADDRESS}.",
            "servers": server,
            "messages": {"reply": {"$ref": f"#/components/messages/{name}.reply"}},
        }
        waits = "indexed" if op.waits_for == "indexing" else "committed (read-your-writes)"
        doc["operations"][channel] = {
            "action": "receive",
            "title": name,
            "summary": op.summary,
            "description": f"With `min_seq`: answered once that sequence is {waits}. "
            "Replicas share requests in one queue group.",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/request"}],
            "bindings": {"nats": {"queue": settings.query.queue_group, "bindingVersion": "0.1.0"}},
            "reply": {
                "channel": {"$ref": f"#/channels/{reply_channel}"},
                "messages": [{"$ref": f"#/channels/{reply_channel}/messages/reply"}],
            },
        }


# --- the commit floor ----------------------------------------------------------------


def _add_commit_floor(doc: dict[str, Any], server: list[dict[str, str]], settings: Settings) -> None:
    """The query workers hear the committed notices the persistence and the
    indexing replicas publish: FastStream documents the publishing side, and
    its schema of the payload."""
    assert "CommittedRanges" in doc["components"]["schemas"], "the persistence side declares the notice"
    _add_notice_subscription(
        doc,
        server,
        f"{PREFIX}.committed.<durable>:query",
        committed_subject(settings.persistence.durable),
        "Query worker: drop this replica's cached answers that the batch made stale, then move "
        "the commit floor (read-your-writes) over the sequences a persistence replica finished with, and wake "
        "the reads waiting on them. Every replica hears every notice (no queue group). An app with a stream of "
        "its own (streams.apps) has its own floor and notices, on this subject with `.<stream>` appended.",
    )
    _add_notice_subscription(
        doc,
        server,
        f"{PREFIX}.committed.<indexing durable>:query",
        committed_subject(settings.indexing.durable),
        "Query worker: move the indexing floor over the sequences an indexing replica finished "
        "with, and wake the searches waiting on them (a search's min_seq). Every replica hears every notice. "
        "An app's own stream: `.<stream>` appended.",
    )


def _add_notice_subscription(
    doc: dict[str, Any], server: list[dict[str, str]], channel: str, subject: str, description: str
) -> None:
    doc["components"]["messages"][f"{channel}:SubscribeMessage"] = {
        "title": f"{channel}:SubscribeMessage",
        "contentType": "application/json",
        "payload": {"$ref": SCHEMAS + "CommittedRanges"},
    }
    doc["channels"][channel] = {
        "address": subject,
        "description": description,
        "servers": server,
        "bindings": {"nats": {"subject": subject, "bindingVersion": "custom"}},
        "messages": {"SubscribeMessage": {"$ref": f"#/components/messages/{_escaped(channel)}:SubscribeMessage"}},
    }
    doc["operations"][channel] = {
        "action": "receive",
        "channel": {"$ref": f"#/channels/{_escaped(channel)}"},
        "messages": [{"$ref": f"#/channels/{_escaped(channel)}/messages/SubscribeMessage"}],
    }


def _escaped(name: str) -> str:
    """A name as a JSON pointer token in a $ref, the way FastStream writes them."""
    return name.replace("<", "%3C").replace(">", "%3E")


# --- dead letters ------------------------------------------------------------------


def _add_dead_letters(doc: dict[str, Any], server: list[dict[str, str]]) -> None:
    doc["components"]["messages"]["dead-letter"] = {
        "name": "dead letter",
        "summary": "A stream message a worker could not process, as it was received.",
        "description": "The payload is the original message's bytes, unchanged (it may not be valid JSON: "
        "that can be why it is here). The headers say which worker gave up, why, and where it came from.",
        "headers": {
            "type": "object",
            "properties": {
                header: {"type": "string", "description": why} for header, why in DEAD_LETTER_HEADERS.items()
            },
            "required": list(DEAD_LETTER_HEADERS),
        },
        "payload": {"description": "the original message, byte for byte"},
    }
    doc["channels"]["dlq"] = {
        "address": f"{PREFIX}.dlq.{{worker}}",
        "title": "dead letters",
        "description": f"Captured by the JetStream stream {DLQ_STREAM}; `memq dlq` lists and replays them.",
        "servers": server,
        "messages": {"dead-letter": {"$ref": "#/components/messages/dead-letter"}},
    }
    doc["operations"]["dlq"] = {
        "action": "send",
        "title": "Dead-letter a message",
        "summary": "A worker that cannot process a message (invalid, or failing past its retries) parks it here.",
        "channel": {"$ref": "#/channels/dlq"},
        "messages": [{"$ref": "#/channels/dlq/messages/dead-letter"}],
    }


# --- shared pieces -------------------------------------------------------------------


def _schema(doc: dict[str, Any], name: str, schema: dict[str, Any]) -> str:
    """Put ``schema`` and its nested models (``$defs``, referenced as
    components already) among the document's schemas; return its name. A
    name taken by another schema is a bug: the document would mean two things."""
    schemas = doc["components"]["schemas"]
    schema = dict(schema)
    for def_name, definition in {**schema.pop("$defs", {}), name: schema}.items():
        if schemas.setdefault(def_name, definition) != definition:
            raise ValueError(f"two different schemas are both called {def_name!r}")
    return name


def _add_parameters(doc: dict[str, Any]) -> None:
    parameters = doc["components"].setdefault("parameters", {})
    for channel in doc["channels"].values():
        names = re.findall(r"{(\w+)}", channel.get("address") or "")
        for name in names:
            parameters.setdefault(name, {"description": PARAMETERS[name]})
        if names:
            channel["parameters"] = {name: {"$ref": f"#/components/parameters/{name}"} for name in names}


def _asyncapi_schemas(value: Any) -> Any:
    """Pydantic writes OpenAPI's discriminator (an object); an AsyncAPI
    schema's is the property name alone."""
    if isinstance(value, dict):
        out = {k: _asyncapi_schemas(v) for k, v in value.items()}
        if isinstance(out.get("discriminator"), dict):
            out["discriminator"] = out["discriminator"]["propertyName"]
        return out
    if isinstance(value, list):
        return [_asyncapi_schemas(v) for v in value]
    return value


def _first_paragraph(doc: str | None) -> str:
    return (doc or "").strip().split("\n\n")[0].replace("\n", " ")


def render(doc: dict[str, Any]) -> str:
    # Sorted: FastStream lists publishers in an order that varies with the
    # process's string hash seed, and the committed document must not.
    return json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def write(path: Path = DEFAULT_PATH) -> Path:
    path.write_text(render(document()), encoding="utf-8")
    return path


def is_current(path: Path = DEFAULT_PATH) -> bool:
    """Whether ``path`` holds the document this code generates."""
    return path.is_file() and path.read_text(encoding="utf-8") == render(document())


def main(argv: typing.Sequence[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT_PATH
    print(write(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

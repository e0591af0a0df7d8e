"""Instruction templates rendered from state, as Hector (and ADK) do.

Syntax (Hector ``pkg/instruction/template.go``):

``{key}``
    session-scoped state ``key``.
``{user:key}`` / ``{app:key}`` / ``{temp:key}``
    user-, app- and temp-scoped state, looked up under that prefixed name,
    which is how :func:`memq.workers.memory.state.merge_state` presents it.
``{artifact.name}``
    the text of an artifact, when the caller passes ``artifacts``.
``{key?}``
    optional: renders empty when the key is missing. Without ``?`` a missing
    key raises :class:`TemplateKeyError`.

Names are identifiers (a letter or ``_``, then letters, digits or ``_``;
Unicode letters count), optionally with one of the three prefixes; spaces
inside the braces are ignored. Anything else in braces, such as
``{"a": 1}``, is left as written, as in Hector, so JSON examples survive.

Values: strings as they are; ``None`` as empty (Hector renders nil as
empty); anything else as compact JSON with sorted keys (``true``, ``3``,
``{"a":1}``).

Literal braces: write ``{{`` and ``}}`` (as in Python's ``str.format``), so
``{{user:name}}`` renders ``{user:name}``. Hector has no escape (it would
substitute ``{{user:name}}``); this is memq's one deviation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memq.contracts.errors import MemqError
from memq.workers.memory.tokens import dumps

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_NAME = re.compile(r"(?:(?:app|user|temp):)?[^\W\d]\w*")
_ARTIFACT = "artifact."


class TemplateKeyError(MemqError):
    """An instruction template names a state key (or artifact) that is not
    set, without ``?``. ``key`` is the name as written, prefix included."""

    code = "template_key_missing"

    def __init__(self, key: str):
        super().__init__(f"instruction template needs {key!r}, which is not set (write {{{key}?}} to make it optional)")
        self.key = key


def _render_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return dumps(value)


def _parse(inner: str) -> tuple[str, bool] | None:
    """``(name, optional)`` for a placeholder's inside, or None if it is not one."""
    name = inner.strip()
    optional = name.endswith("?")
    if optional:
        name = name[:-1].rstrip()
    if name.startswith(_ARTIFACT) and len(name) > len(_ARTIFACT):
        return name, optional
    if _NAME.fullmatch(name):
        return name, optional
    return None


def render(
    template: str,
    state: Mapping[str, Any],
    *,
    artifacts: Mapping[str, str] | None = None,
) -> str:
    """Render ``template`` with ``state``.

    Parameters:
        template: the instruction template (syntax in the module docstring).
        state: merged state: session keys bare, others with ``user:``,
            ``app:``, ``temp:`` prefixes (``merge_state`` plus any temp keys).
        artifacts: artifact texts by filename for ``{artifact.name}``
            (default None: every artifact counts as missing).

    Raises :class:`TemplateKeyError` for a missing key without ``?``.
    """

    def replace(match: re.Match[str]) -> str:
        whole = match.group(0)
        if whole == "{{":
            return "{"
        if whole == "}}":
            return "}"
        parsed = _parse(match.group(1))
        if parsed is None:
            return whole
        name, optional = parsed
        if name.startswith(_ARTIFACT):
            source: Mapping[str, Any] = artifacts or {}
            key = name[len(_ARTIFACT) :]
        else:
            source, key = state, name
        if key in source:
            return _render_value(source[key])
        if optional:
            return ""
        raise TemplateKeyError(name)

    return _TOKEN.sub(replace, template)


def placeholders(template: str) -> list[str]:
    """The names a template uses, in first-use order, without ``?``."""
    seen: dict[str, None] = {}
    for match in _TOKEN.finditer(template):
        if match.group(1) is None:
            continue
        parsed = _parse(match.group(1))
        if parsed is not None:
            seen.setdefault(parsed[0], None)
    return list(seen)

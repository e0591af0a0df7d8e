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

Size before work: a template repeats what it substitutes, so a few KB of
``{k}`` with a 20 KB ``k`` render hundreds of MB. :func:`rendered_size` says
how long :func:`render` would be from the template's distinct tokens and the
lengths of their values, without building it, so the caller can refuse an
answer too big to send before spending the time and memory on it. Both
resolve each distinct token once (:func:`_table`) and walk the template in C
(``re.findall``, ``re.split``), not in a Python callback per match.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from memq.contracts.errors import MemqError
from memq.workers.memory.tokens import dumps

_TOKEN = re.compile(r"(\{\{|\}\}|\{[^{}]*\})")  # one group: split() keeps the tokens
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


def _rendered_token(token: str, state: Mapping[str, Any], artifacts: Mapping[str, str] | None) -> str:
    """What one token (an escape, a placeholder, other text in braces) renders to."""
    if token == "{{":
        return "{"
    if token == "}}":
        return "}"
    parsed = _parse(token[1:-1])
    if parsed is None:
        return token
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


def _table(tokens: Mapping[str, Any], state: Mapping[str, Any], artifacts: Mapping[str, str] | None) -> dict[str, str]:
    """Each distinct token's rendering, in first-use order: the first missing
    key raised is the one a left-to-right render meets first."""
    return {token: _rendered_token(token, state, artifacts) for token in tokens}


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

    Raises :class:`TemplateKeyError` for a missing key without ``?``. Check
    :func:`rendered_size` first when the result may be too big to use.
    """
    parts = _TOKEN.split(template)  # text, token, text, token, ..., text
    tokens = parts[1::2]
    table = _table(dict.fromkeys(tokens), state, artifacts)
    parts[1::2] = map(table.__getitem__, tokens)
    return "".join(parts)


def rendered_size(
    template: str,
    state: Mapping[str, Any],
    *,
    artifacts: Mapping[str, str] | None = None,
) -> int:
    """``len(render(template, state, artifacts=artifacts))``, without
    rendering: the template's own length, less each token's, plus its
    value's, counted once per distinct token. Costs the template's length
    and each distinct value's rendering once, however often it is used.

    Raises :class:`TemplateKeyError` exactly when :func:`render` does.
    """
    uses = Counter(_TOKEN.findall(template))
    table = _table(uses, state, artifacts)
    return len(template) + sum((len(table[token]) - len(token)) * n for token, n in uses.items())


def placeholders(template: str) -> list[str]:
    """The names a template uses, in first-use order, without ``?``."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(template):
        if token in ("{{", "}}"):
            continue
        parsed = _parse(token[1:-1])
        if parsed is not None:
            seen.setdefault(parsed[0], None)
    return list(seen)

"""The vocabularies a request names, defined here once: the requests
(:mod:`memq.contracts.queries`), the events' messages, the workers' settings and the CLI's choices
derive from these. Plain types, no models: the ``memq`` command reads them
without building the query models (and ``memq --help`` stays quick).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

StrategyKind = Literal["all", "buffer_window", "token_window", "summary_buffer"]
STRATEGY_KINDS: tuple[StrategyKind, ...] = get_args(StrategyKind)
STRATEGY_ALIASES: dict[str, StrategyKind] = {"none": "all"}  # Hector's name for "include all history"
StrategyName = Literal[StrategyKind, "none"]  # what a request may say: a kind or an alias
STRATEGY_NAMES: tuple[str, ...] = (*STRATEGY_KINDS, *STRATEGY_ALIASES)
SearchMode = Literal["keyword", "vector", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = get_args(SearchMode)
ContextFormat = Literal["memq", "openai"]
CONTEXT_FORMATS: tuple[ContextFormat, ...] = get_args(ContextFormat)
# Whose writes a read sees: the caller's own (its ``min_seq``), or also every
# write any client had acknowledged before the read, in the read's scope.
Consistency = Literal["own", "any"]
CONSISTENCIES: tuple[Consistency, ...] = get_args(Consistency)
Role = Literal["user", "assistant", "system", "tool"]  # a message's
# What a search may keep: a message's role, or a summary's (a checkpoint is indexed too).
SearchRole = Literal[Role, "summary"]


def normalize_kind(kind: Any) -> Any:
    """``kind`` with aliases resolved (``"none"`` -> ``"all"``); anything
    else is returned unchanged, for the caller's own validation."""
    return STRATEGY_ALIASES.get(kind, kind) if isinstance(kind, str) else kind

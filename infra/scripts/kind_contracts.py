"""import-linter contract types whose worker kinds come from memq's registry.

``kinds-are-peers`` and ``runtime-names-no-kind`` in pyproject.toml are about
every worker kind. Written as import-linter's own ``independence`` and
``forbidden`` contracts they had to list the kinds' packages again, so a new
kind meant an edit of pyproject.toml too. These two types take the kinds
from the registry a contract names (``registry = "memq.workers.runtime.kinds:KINDS"``:
each entry's ``component``, ``"package.module:Class"``, gives its package)
and add them to the modules the contract lists itself (a kind's folder
before it is registered; other packages the runtime must not import).

import-linter imports this module by the name pyproject.toml gives it
(``contract_types``), from ``infra/scripts`` on the path (check.sh and
tests/unit/test_layering.py put it there).
"""

from __future__ import annotations

import importlib
from typing import Any

from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract


def kind_packages(registry: str) -> list[str]:
    """The packages of the kinds in ``registry`` (``"module:NAME"``)."""
    module, _, name = registry.partition(":")
    kinds = getattr(importlib.import_module(module), name)
    return sorted({kind.component.partition(":")[0].rpartition(".")[0] for kind in kinds.values()})


def _with_kinds(options: dict[str, Any], field: str) -> dict[str, Any]:
    options = dict(options)
    registry = options.pop("registry")
    options[field] = sorted({*kind_packages(registry), *options.get(field, [])})
    return options


class KindsIndependence(IndependenceContract):
    """``independence`` over every registered kind, plus ``modules``."""

    def __init__(self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]) -> None:
        super().__init__(name, session_options, _with_kinds(contract_options, "modules"))


class KindsForbidden(ForbiddenContract):
    """``forbidden``, with every registered kind among ``forbidden_modules``."""

    def __init__(self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]) -> None:
        super().__init__(name, session_options, _with_kinds(contract_options, "forbidden_modules"))

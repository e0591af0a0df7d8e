"""Sphinx configuration: ``sphinx-build -W --keep-going -n -b html docs docs/_build/html``."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS / "_ext")]  # memq_refs; the code is imported as installed (memq.*)

project = "memq"
author = "the memq authors"
copyright = "the memq authors, Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "memq_refs",  # the configuration, CLI and benchmark pages, generated from the code and data
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated", "benchmarks/results", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist", "substitution"]
# Defaults quoted in prose come from the code too: {{ default.MEMQ_METRICS__REFRESH_S }}
import memq_refs  # noqa: E402

myst_substitutions = {"default": memq_refs.plain_defaults()}
myst_heading_anchors = 3

# Every reference must resolve (-n), except into libraries whose inventories
# we do not fetch (the build machine may not reach their documentation).
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(nats|pydantic|pydantic_core|typing_extensions|annotated_types|uuid_utils)(\..*)?"),
    (r"py:.*", r"(Client|ObjectStore|BaseModel|ConfigDict|FieldInfo|SecretStr|ValidationError)"),
    (
        r"py:.*",
        r"(collections\.abc\.|typing\.)?(AsyncIterator|Awaitable|Callable|Sequence|Any|Literal|Generic|TypeVar)",
    ),
    (
        r"py:.*",
        r"(R|ModelFn|Strategy|StrategyName|StrategyKind|ContextFormat|SearchMode|Consistency|Role|After|ErrorCallback|_Prepared)",
    ),
    (r"py:.*", r"(datetime|pathlib|enum|asyncio|ssl)\..*"),
    (r"py:class", r"(Exception|ValueError|int|str|bytes|float|bool|dict|list|tuple|None)"),
    # private bases and the contract's annotated id types (pydantic validators, not classes)
    (r"py:.*", r"(.*\.)?_[A-Za-z]\w*"),
    (r"py:class", r"(AfterValidator|BeforeValidator|PlainSerializer)"),
    (r"py:class", r"(AppId|UserId|SessionId|EventId|NoNul|Timestamp|JsonObject|JsonValue|StateDelta|Part)"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# pydantic's own attributes are not the contract
autodoc_default_options = {"exclude-members": "model_config,model_fields,model_computed_fields"}
autodoc_mock_imports: list[str] = []

html_theme = "alabaster"
html_static_path = ["_static"]
html_css_files = ["memq.css"]
html_title = "memq"
html_theme_options = {"description": "Session and memory layer for LLM agents on NATS JetStream", "fixed_sidebar": True}

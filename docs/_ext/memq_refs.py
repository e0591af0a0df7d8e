"""Reference pages generated from the code at docs build time (a Sphinx extension).

- the configuration reference from :class:`memq.workers.settings.Settings`: every
  setting's ``MEMQ_*`` variable, type, default and description (the defaults
  exist once, in the code);
- the command reference from the typer app :data:`memq.workers.cli.app`: every
  command with its arguments and options, required ones marked;
- the benchmark tables from the result files in ``docs/benchmarks/results/``.

Each is written as Markdown into ``docs/_generated/`` (git-ignored) when the
build starts, and the pages ``{include}`` it; the settings page instead is
committed as ``docs/reference/settings.md`` (:data:`SETTINGS_PAGE`). A file is rewritten only when its
text changes, so an unchanged build stays incremental. The functions are plain
Python, also used by ``tests/unit/test_docs.py``.
"""

from __future__ import annotations

import enum
import json
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DOCS = Path(__file__).resolve().parents[1]
GENERATED = DOCS / "_generated"
RESULTS = DOCS / "benchmarks" / "results"


# --- settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    env: str  # MEMQ_SECTION__FIELD
    section: str  # "" for top-level fields
    type: str
    default: str  # Markdown
    description: str  # Markdown, may be empty
    secret: bool


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    from memq.workers.settings import default_data_dir

    if field.default_factory is default_data_dir:
        return "`$XDG_DATA_HOME/memq`, else `~/.local/share/memq`"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        return "(secret)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


def _is_model(annotation: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def settings() -> list[Setting]:
    """Every leaf setting of :class:`memq.workers.settings.Settings`, in code order."""
    from pydantic import SecretStr

    from memq.workers.settings import Settings

    out: list[Setting] = []

    def walk(model: Any, prefix: str, section: str, context: str = "") -> None:
        for name, field in model.model_fields.items():
            env = f"{prefix}{name.upper()}"
            if _is_model(field.annotation):
                walk(field.annotation, f"{env}__", section or name, (field.description or "").strip())
                continue
            text = (field.description or "").strip()
            if context:  # a shared model (TLS) says what it is for on its first setting
                text, context = f"{text} ({context})" if text else context, ""
            secret = "SecretStr" in _type_name(field.annotation) or field.annotation is SecretStr
            out.append(Setting(env, section, _type_name(field.annotation), _default(field), text, secret))

    walk(Settings, "MEMQ_", "")
    return out


def plain_defaults() -> dict[str, str]:
    """Each setting's default as plain text (``30``, ``summary_buffer``,
    ``unset``), for prose: ``{{ default.MEMQ_METRICS__REFRESH_S }}`` in a
    page (MyST substitutions, set up in ``conf.py``)."""
    from memq.workers.settings import Settings, default_data_dir

    out: dict[str, str] = {}

    def walk(model: Any, prefix: str) -> None:
        for name, field in model.model_fields.items():
            env = f"{prefix}{name.upper()}"
            if _is_model(field.annotation):
                walk(field.annotation, f"{env}__")
                continue
            if field.default_factory is default_data_dir:
                out[env] = "~/.local/share/memq"
                continue
            value = field.default_factory() if field.default_factory is not None else field.default
            if isinstance(value, enum.Enum):
                value = value.value
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if value is None:
                text = "unset"
            elif isinstance(value, str):
                text = value
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
            out[env] = text

    walk(Settings, "MEMQ_")
    return out


def section_titles() -> dict[str, str]:
    from memq.workers.settings import Settings

    titles = {"": "General"}
    for name, field in Settings.model_fields.items():
        if _is_model(field.annotation):
            doc = (field.annotation.__doc__ or "").strip()
            # pydantic gives every model a generic docstring; keep only our own
            titles[name] = doc if doc and not doc.startswith("Usage docs") and "A base class" not in doc else ""
    return titles


def settings_markdown() -> str:
    rows = settings()
    titles = section_titles()
    lines = [
        "<!-- generated by docs/_ext/memq_refs.py from memq.workers.settings.Settings; do not edit -->",
        "",
    ]
    for section in dict.fromkeys(s.section for s in rows):
        heading = "General" if section == "" else f"`{section}`"
        lines += [f"## {heading}", ""]
        if section and titles.get(section):
            lines += [" ".join(titles[section].split()), ""]
        for s in (r for r in rows if r.section == section):
            lines += [f"```{{envvar}} {s.env}", "```", ""]
            # A paragraph after the directive (not in its body) stays Markdown.
            meta = f"type `{s.type}` · default {s.default}" + (
                " · secret (masked by `memq config`)" if s.secret else ""
            )
            lines += [meta, "", s.description or "*(no description)*", ""]
    return "\n".join(lines)


# --- the command line --------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    names: str  # "-u, --user" or "SESSION"
    metavar: str
    kind: str  # "argument" | "option" | "flag"
    required: bool
    default: str
    help: str
    envvar: str


@dataclass(frozen=True)
class Command:
    path: str  # "memq sessions list"
    usage: str
    help: str
    params: list[Param]
    group: bool


def _click_root():
    import typer.main

    from memq.workers.cli import app

    return typer.main.get_command(app)


def commands() -> list[Command]:
    """Every command and group of ``memq``, depth first, as click sees them.

    Duck-typed: typer may bring its own copy of click (``typer._click``)."""
    out: list[Command] = []

    def walk(cmd: Any, path: str, ctx: Any) -> None:
        ctx = cmd.context_class(cmd, info_name=path.split()[-1], parent=ctx)
        group = hasattr(cmd, "list_commands")
        params = []
        usage = [path, "[OPTIONS]"]
        for p in cmd.params:
            if getattr(p, "hidden", False) or p.name == "help":
                continue
            if p.param_type_name == "argument":
                names, metavar, kind = p.name.upper() + ("..." if p.nargs == -1 else ""), "", "argument"
                usage.append(names if p.required else f"[{names}]")
            else:
                spec = p.get_help_record(ctx)[0]  # "-u, --user <str>", as `--help` shows it
                names = ", ".join(n.split()[0] for n in spec.split(", "))
                metavar = spec.rsplit(" ", 1)[1] if not p.is_flag and " " in spec.split(", ")[-1] else ""
                if not p.is_flag:  # "<int range>": the metavar is what follows the last name
                    last = spec.split(", ")[-1]
                    metavar = last.split(" ", 1)[1] if " " in last else ""
                kind = "flag" if p.is_flag else "option"
            default = p.default
            if callable(default) or default in (None, (), []) or (kind == "flag" and default is False):
                shown = ""
            elif isinstance(default, enum.Enum):
                shown = f"`{default.value}`"
            elif isinstance(default, (list, tuple)):
                shown = ", ".join(f"`{d}`" for d in default)
            else:
                shown = f"`{default}`"
            envvar = p.envvar if isinstance(p.envvar, str) else ", ".join(p.envvar or ())
            help_text = " ".join((getattr(p, "help", "") or "").split())
            params.append(Param(names, metavar, kind, bool(p.required), shown, help_text, envvar))
        if group:
            usage = [path, "COMMAND", "[ARGS]..."]
        usage = " ".join(usage)
        out.append(Command(path, usage, (cmd.help or "").strip(), params, group))
        if group:
            for name in cmd.list_commands(ctx):
                walk(cmd.commands[name], f"{path} {name}", ctx)

    walk(_click_root(), "memq", None)
    return out


def cli_markdown() -> str:
    lines = [
        "<!-- generated by docs/_ext/memq_refs.py from memq.workers.cli.app; do not edit -->",
        "",
    ]
    for c in commands():
        level = "###" if c.path.count(" ") <= 1 else "####"  # below the page's "## Every command"
        lines += [f"{level} `{c.path}`", ""]
        lines += [f"```{{program}} {c.path}", "```", ""]
        lines += ["```text", c.usage, "```", ""]
        if c.help:
            lines += [_paragraphs(c.help), ""]
        for p in c.params:  # a group's too: memq's own --version
            name = f"{p.names} {p.metavar}".strip()
            lines += [f"```{{option}} {name}", "```", ""]
            tags = []
            if p.required:
                tags.append("**required**")
            if p.default:
                tags.append(f"default {p.default}")
            if p.envvar:
                tags.append(f"environment `{p.envvar}`")
            text = p.help or ""
            lines += [(text + (" " if text and tags else "") + " · ".join(tags)).strip() or "—", ""]
    return "\n".join(lines)


def _paragraphs(text: str) -> str:
    """Click keeps a help text's paragraphs; re-flow each into one line."""
    return "\n\n".join(" ".join(p.split()) for p in text.replace("\b", "").split("\n\n"))


def required_options() -> dict[str, list[str]]:
    """Command path -> its required options and arguments (for tests and the README)."""
    return {c.path: [p.names for p in c.params if p.required] for c in commands() if not c.group}


# --- benchmark results ---------------------------------------------------------------


def _cell(value: Any, fmt: str | None, bold: bool) -> str:
    if value is None:
        text = "–"
    elif isinstance(value, bool):
        text = "✓" if value else "✗"
    elif isinstance(value, list):
        return " / ".join(_cell(v, fmt, False) for v in value) if not bold else f"**{_cell(value, fmt, False)}**"
    elif isinstance(value, (int, float)) and fmt:
        text = format(value, fmt)
    else:
        text = str(value)
    text = text.replace("|", "\\|")
    return f"**{text}**" if bold else text


def benchmark_markdown(name: str) -> str:
    """The tables of ``docs/benchmarks/results/<name>.json`` with a line on
    where and when they were measured."""
    data = json.loads((RESULTS / f"{name}.json").read_text())
    m = data["measured"]
    when = f", {m['date']}," if m.get("date") else " (date not recorded)"
    where = f"on {m['machine']}" if m.get("machine") else "(machine not recorded)"
    conditions = f"; {m['conditions']}" if m.get("conditions") else ""
    lines = [
        f"<!-- generated by docs/_ext/memq_refs.py from docs/benchmarks/results/{name}.json; do not edit -->",
        "",
        f"Measured with `{data['script']}` at commit `{m['commit']}`{when} {where}{conditions}.",
        "",
    ]
    for table in data["tables"]:
        cols = table["columns"]
        if table.get("title"):
            lines += [f"*{table['title']}*", ""]
        lines.append("| " + " | ".join(c["name"].replace("|", "\\|") for c in cols) + " |")
        lines.append("|" + "|".join("---" for _ in cols) + "|")
        for row in table["rows"]:
            cells = [_cell(row[c["key"]], c.get("format"), c.get("bold", False)) for c in cols]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def benchmark_names() -> list[str]:
    return sorted(p.stem for p in RESULTS.glob("*.json"))


# --- Sphinx -------------------------------------------------------------------------


# The settings page is committed (docs/reference/settings.md), not only built: a
# checkout read on GitHub or in an editor has the table too (issue 40).
# tests/unit/test_settings_page.py fails when it drifts from the code.
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
SETTINGS_COMMAND = ".venv/bin/python docs/_ext/memq_refs.py"


def settings_page() -> str:
    """The committed page of every setting: a title, then :func:`settings_markdown`."""
    intro = (
        "# Every setting\n\n"
        "Generated from `memq.workers.settings.Settings` (names, types, defaults and each field's "
        "description); how to set them is in the [configuration reference](configuration.md). "
        f"Regenerate with `{SETTINGS_COMMAND}` after changing a setting.\n\n"
    )
    return intro + settings_markdown() + "\n"


def generate(out: Path = GENERATED) -> list[Path]:
    """Write every generated page; return those whose text changed."""
    pages = {"cli.md": cli_markdown()}
    pages |= {f"bench-{name}.md": benchmark_markdown(name) for name in benchmark_names()}
    out.mkdir(exist_ok=True)
    changed = []
    for filename, text in pages.items():
        path = out / filename
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_name(f".{filename}.{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)  # a build running beside this one never reads half a page
            changed.append(path)
    return changed


def _on_builder_inited(app: Any) -> None:
    generate()


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # SETTINGS_COMMAND: rewrite the committed settings page
    SETTINGS_PAGE.write_text(settings_page())
    print(SETTINGS_PAGE.relative_to(DOCS.parent))

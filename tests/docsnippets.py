"""The documentation's code blocks, and the shell commands in them, as a
reader pastes them into a fresh shell in the checkout (no virtualenv
activated, so `memq`, `pip` and `python` are not on PATH).

Used by tests/unit/test_docs.py (what can be checked without running:
every command names something that exists and its arguments parse) and
tests/integration/test_doc_snippets.py (what runs against a real stack).

A block opts out of being run, never of being checked, with a marker on the
line right before it that gives a reason:

    <!-- snippet: skip (deployment-only: needs a TLS cluster) -->

Only such a block may call tools from outside the checkout (docker, kubectl).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).parents[1]
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->$")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```\s*$", re.M | re.S)
SHELL_LANGS = ("bash", "sh", "shell", "console")
# What a fresh shell in the checkout runs without a marker besides the
# checkout's own programs (.venv/bin/…, bash infra/…).
SHELL_BUILTINS = ("bash", "cd", "source")
# Not on PATH until the virtualenv is activated: the reader gets "command not found".
VENV_ONLY = ("memq", "pip", "pip3", "python", "pytest", "sphinx-build")
OPERATORS = ("&&", "||", ";", "|", "&")
REDIRECTS = (">", ">>", "<")


@dataclass(frozen=True)
class Snippet:
    path: str
    line: int
    lang: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not {"_build", "_generated"} & set(p.parts)]
    return [ROOT / "README.md", *docs]


def snippets() -> list[Snippet]:
    found = []
    for path in doc_files():
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = [ln.strip() for ln in text[: m.start()].splitlines() if ln.strip()]
            marker = SKIP.match(before[-1]) if before else None
            lang = m.group("lang").lower()
            body = "\n".join(ln[len(m.group("indent")) :] for ln in m.group("body").splitlines())
            found.append(
                Snippet(str(path.relative_to(ROOT)), line, lang, body, marker.group("reason") if marker else None)
            )
    return found


def shell_snippets() -> list[Snippet]:
    return [s for s in snippets() if s.lang in SHELL_LANGS]


@dataclass(frozen=True)
class Command:
    """One simple command of a shell block: ``env argv > stdout``."""

    snippet: Snippet
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    stdout: str | None = None  # the file a `>` redirect writes
    cwd: str = "."  # relative to the checkout, after the block's `cd`s

    @property
    def text(self) -> str:
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*env, *map(shlex.quote, self.argv)] + ([">", self.stdout] if self.stdout else []))


def shell_commands(snippet: Snippet) -> list[Command]:
    """The simple commands of a shell block, split at ``&&``, ``;``, ``|``
    and new lines (``\\`` continues a line); comments, subshell parentheses
    and lines of bare assignments dropped; a leading ``$ `` prompt (console
    blocks) removed."""
    code = re.sub(r"\\\n", " ", snippet.code)
    commands: list[Command] = []
    cwd = Path(".")
    for line in code.splitlines():
        line = re.sub(r"^\s*\$ ", "", line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in OPERATORS:
                command = _command(snippet, words, cwd)
                if command.argv:  # not only assignments (an env file's lines)
                    commands.append(command)
                    if command.argv[:1] == ("cd",) and len(command.argv) == 2:
                        cwd = cwd / command.argv[1]
                words = []
            elif token not in ("(", ")"):
                words.append(token)
    return commands


def _command(snippet: Snippet, words: list[str], cwd: Path) -> Command:
    env: dict[str, str] = {}
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    argv: list[str] = []
    stdout = None
    rest = iter(words)
    for word in rest:
        if word in REDIRECTS:
            target = next(rest, "")
            if word != "<":
                stdout = target
        else:
            argv.append(word)
    return Command(snippet, tuple(argv), env, stdout, str(cwd))


# --- what can be checked without running ---------------------------------------


def dev_sh_commands() -> set[str]:
    """The subcommands infra/dev.sh's `case` dispatches on."""
    script = (ROOT / "infra/dev.sh").read_text().split("\ncase ", 1)[1]
    return {m for labels in re.findall(r"^  ([\w|-]+)\)", script, re.M) for m in labels.split("|")}


def extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def memq_parse_error(args: list[str] | tuple[str, ...]) -> str | None:
    """Why `memq ARGS` would not parse (unknown command or option, a missing
    required one, a value of the wrong type), or None; runs nothing."""
    import typer
    import typer.main

    from memq.workers.cli import app

    command = typer.main.get_command(app)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # a --help prints
            ctx = command.make_context("memq", list(args))
            while hasattr(command, "resolve_command"):  # a group: on to its subcommand
                name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
                ctx = command.make_context(name, rest, parent=ctx)
    except typer.Exit as exc:
        return None if exc.exit_code == 0 else f"exits {exc.exit_code}"
    except Exception as exc:  # typer's (vendored) click errors say what is wrong
        if hasattr(exc, "format_message"):
            return exc.format_message() or type(exc).__name__
        raise
    return None


def written_before(snippet: Snippet) -> set[str]:
    """Files the shell blocks before ``snippet`` on its page write (``> FILE``
    or ``--out FILE``): a later command of the page may read them."""
    files: set[str] = set()
    for earlier in shell_snippets():
        if earlier.path == snippet.path and earlier.line < snippet.line:
            for c in shell_commands(earlier):
                files |= {c.stdout} if c.stdout else set()
                files |= {c.argv[i + 1] for i, a in enumerate(c.argv[:-1]) if a in ("--out", "-o")}
    return files


def problem(command: Command, venv_bin: Path) -> str | None:
    """What stops ``command`` from working when pasted into a fresh shell in
    the checkout (with ``venv_bin`` as .venv/bin), or None. Only what can be
    told without running: the executable exists, and for `memq` and
    infra/dev.sh the subcommand and options parse (in an empty folder that
    has the files the page wrote before, which memq may insist exist)."""
    if not command.argv:
        return None
    exe, args = command.argv[0], list(command.argv[1:])
    cwd = ROOT / command.cwd
    if exe in VENV_ONLY:
        return f"`{exe}` is not on PATH in a fresh shell: write .venv/bin/{exe}"
    if exe.startswith(".venv/bin/"):
        name = exe.removeprefix(".venv/bin/")
        if not (venv_bin / name).is_file():
            return f"{exe} does not exist after `bash infra/dev.sh setup`"
        if name == "memq":
            with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
                for file in written_before(command.snippet):
                    Path(file).touch()
                return memq_parse_error(args)
        if name == "python" and args and not args[0].startswith("-") and not (cwd / args[0]).is_file():
            return f"{args[0]}: no such file in the checkout"
        if name == "pytest":
            return _test_paths_problem(args, cwd)
        return None
    if exe == "cd":
        return None if args and (cwd / args[0]).is_dir() else f"cd {args}: no such folder in the checkout"
    if exe == "bash":
        if not args or not (cwd / args[0]).is_file():
            return f"bash {args[:1]}: no such script in the checkout"
        if Path(args[0]) == Path("infra/dev.sh"):
            return _dev_sh_problem(args[1:])
        return None
    if exe in SHELL_BUILTINS:
        return None
    if command.snippet.skip:
        return None  # deployment tools (docker, kubectl): the block says why it is not run
    return f"`{exe}` is not part of the checkout: mark the block <!-- snippet: skip (why) -->"


def _dev_sh_problem(args: list[str]) -> str | None:
    if not args or args[0] not in dev_sh_commands():
        return f"infra/dev.sh {args[:1]}: not one of {sorted(dev_sh_commands())}"
    sub, rest = args[0], args[1:]
    if sub == "setup" and rest and rest[0] not in extras():
        return f"infra/dev.sh setup {rest[0]}: not an extra of pyproject.toml ({sorted(extras())})"
    if sub == "up":
        return memq_parse_error(["up", *rest])
    if sub == "test":
        return _test_paths_problem(rest, ROOT)
    return None


def _test_paths_problem(pytest_args: list[str], cwd: Path) -> str | None:
    # options' values (-k expr) are not paths: only words that look like one
    paths = [a for a in pytest_args if not a.startswith("-") and ("/" in a or a.endswith(".py"))]
    missing = [a for a in paths if not (cwd / a.split("::")[0]).exists()]
    return f"no such test path: {missing}" if missing else None

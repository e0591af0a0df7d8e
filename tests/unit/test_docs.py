"""The documentation: it builds with warnings as errors, and what it says about
settings and commands comes from the code (docs/_ext/memq_refs.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import docsnippets as ds
import memq_refs
import pytest

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def test_readme_names_the_two_commands():
    assert "bash infra/dev.sh up" in README
    assert ".venv/bin/memq demo" in README
    assert "bash infra/dev.sh test" in README


def test_every_setting_is_documented():
    # The generated reference lists every setting by construction (checked
    # below); what can be missing is what it means.
    missing = [s.env for s in memq_refs.settings() if not s.description]
    assert not missing, f"add a Field(description=...) in workers/settings.py: {missing}"


def test_configuration_reference_lists_every_setting_with_its_default():
    page = memq_refs.settings_markdown()
    for s in memq_refs.settings():
        assert f"```{{envvar}} {s.env}\n" in page
    from memq.workers.settings import Settings

    assert Settings().persistence.batch_size == 256  # the example below
    assert "type `int` · default `256`" in page.split("MEMQ_PERSISTENCE__BATCH_SIZE", 1)[1].split("```{envvar}")[0]


def test_cli_reference_lists_every_command_and_option():
    page = memq_refs.cli_markdown()
    sections = {s.split("\n", 1)[0]: s for s in page.split("```{program} ")[1:]}
    for command in memq_refs.commands():
        section = sections[command.path]
        for p in command.params:
            assert f"```{{option}} {p.names}" in section
            entry = section.split(f"```{{option}} {p.names}", 1)[1].split("```{", 1)[0]
            assert ("**required**" in entry) == p.required, (command.path, p.names)


def _command_rows(markdown: str) -> list[str]:
    return [
        cells[0]
        for cells in (re.split(r"(?<!\\)\|", line)[1:] for line in markdown.splitlines())
        if cells and cells[0].strip().startswith("`memq ")
    ]


@pytest.mark.parametrize("page", ["README.md", "docs/reference/cli.md"])
def test_command_tables_show_required_options(page):
    required = memq_refs.required_options()
    rows = _command_rows((ROOT / page).read_text())
    assert rows, f"{page} has no command table"
    for cell in rows:
        text = cell.strip().strip("`").replace("\\|", "|")
        words = text.split()
        # the longest command path the row starts with
        path = max((p for p in required if words[: len(p.split())] == p.split()), key=len, default=None)
        assert path, f"{page}: {text!r} is not a memq command"
        rest = words[len(path.split()) :]
        for names in required[path]:
            if names.startswith("-"):
                assert any(n in rest for n in names.split(", ")), f"{page}: {text!r} lacks required {names}"
            else:  # an argument: its name, or a value in its place
                assert names in rest or (rest and not rest[0].startswith(("-", "["))), f"{page}: {text!r} lacks {names}"


def test_benchmark_results_render():
    names = memq_refs.benchmark_names()
    assert {"ingest", "query", "retrieval", "context", "scale"} <= set(names)
    for name in names:
        page = memq_refs.benchmark_markdown(name)
        assert re.search(r"at commit `[0-9a-f]{7,40}`", page), name
        assert page.count("\n|---") >= 1, name


def test_docs_build(tmp_path):
    """Sphinx, warnings as errors (-W), every reference resolved (-n): the
    pages, the generated references and the client's docstrings."""
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None:
        if IN_CI:
            pytest.fail("CI=true and the docs tools are missing: install memq[docs]", pytrace=False)
        pytest.skip("sphinx/myst-parser not installed (pip install -e '.[docs]')")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-n",
            "-E",
            "-q",
            "-b",
            "html",
            str(DOCS),
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "reference" / "configuration.html").is_file()


def test_production_settings_quote_what_infra_sets():
    """docs/operations/deploy.md quotes the values infra/ sets; they must be
    the ones infra/k8s/config.yaml (the same as compose.yaml) holds."""
    config = dict(
        re.findall(r"^  (MEMQ_\w+): \"?([^\"\n#]+?)\"?\s*(?:#.*)?$", (ROOT / "infra/k8s/config.yaml").read_text(), re.M)
    )
    assert config, "no MEMQ_ settings found in infra/k8s/config.yaml"
    table = (
        (DOCS / "operations/deploy.md")
        .read_text()
        .split("## Settings that matter in production", 1)[1]
        .split("\n## ", 1)[0]
    )
    checked = 0
    for line in table.splitlines():
        if not line.startswith("| {envvar}"):
            continue
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        for name in re.findall(r"\{envvar\}`(MEMQ_\w+)`", cells[0]):
            if name in config:
                value = config[name]
                assert value in cells[1] or Path(value).name in cells[1], (
                    f"{name}: infra sets {value!r}, deploy.md says {cells[1]!r}"
                )
                checked += 1
    assert checked >= 8, checked


def test_compose_replica_defaults_are_quoted_right():
    compose = dict(re.findall(r"\$\{(MEMQ_\w+_REPLICAS):-(\d+)\}", (ROOT / "infra/compose.yaml").read_text()))
    names = ["MEMQ_PERSISTENCE_REPLICAS", "MEMQ_INDEXING_REPLICAS", "MEMQ_SUMMARIZER_REPLICAS", "MEMQ_QUERY_REPLICAS"]
    page = " ".join((DOCS / "operations/deploy.md").read_text().split())
    assert f"(defaults {', '.join(compose[n] for n in names)})" in page


# --- commands a reader pastes into a fresh shell ----------------------------------

SHELL = ds.shell_snippets()
VENV_BIN = Path(sys.prefix) / "bin"  # what `bash infra/dev.sh setup` makes .venv/bin


@pytest.mark.parametrize("snippet", SHELL, ids=[s.id for s in SHELL])
def test_shell_commands_work_in_a_fresh_shell(snippet):
    """Each command names something a fresh shell in the checkout has (no
    virtualenv activated), and `memq`'s and infra/dev.sh's subcommands and
    options parse; a block of outside tools says why it is not run."""
    problems = [f"`{c.text}`: {p}" for c in ds.shell_commands(snippet) if (p := ds.problem(c, VENV_BIN))]
    assert not problems, f"{snippet.id}:\n" + "\n".join(problems)


def test_shell_blocks_are_many_and_skips_few():
    commands = [c for s in SHELL for c in ds.shell_commands(s)]
    assert len(commands) >= 30, len(commands)
    # a block whose marker names the test that runs it (curl against a gateway) is run, elsewhere
    elsewhere = {s.id for s in SHELL if s.skip and re.search(r"tests/\S+\.py", s.skip)}
    for s in SHELL:
        if s.id in elsewhere:
            test = ROOT / re.search(r"tests/\S+\.py", s.skip or "")[0]
            assert test.is_file() and s.path in test.read_text(), f"{s.id}: {test} does not run {s.path}"
    skipped = [s.id for s in SHELL if s.skip and s.id not in elsewhere]
    assert len(skipped) <= 4, f"most shell blocks must run or be checked: {skipped}"


@pytest.mark.parametrize(
    "code, found",
    [
        ("memq export > all.jsonl", "not on PATH"),
        ("pip install memq[adk]", "not on PATH"),
        (".venv/bin/memq exprt", "No such command"),
        (".venv/bin/memq demo --events many", "Invalid value"),
        (".venv/bin/memq sessions show s1", "Missing option"),
        ("MEMQ_X=1 .venv/bin/memq export --app a --user u > u.jsonl  # one user", None),
        ("bash infra/dev.sh setup adk", None),
        ("bash infra/dev.sh setup nope", "not an extra"),
        ("bash infra/dev.sh serve", "not one of"),
        ("bash infra/dev.sh up --nats-port 0", None),
        ("bash infra/dev.sh up --port 0", "No such option"),
        (".venv/bin/pytest tests/unit/test_nope.py -q", "no such test path"),
        ("bash infra/dev.sh test tests/unit/test_nope.py", "no such test path"),
        ("bash infra/dev.sh test tests/unit -k docs", None),
        ("curl -s http://127.0.0.1:8480/healthz", "not part of the checkout"),
        ("cd infra && docker compose ps", "not part of the checkout"),
    ],
)
def test_the_shell_check_tells_what_breaks(code, found):
    snippet = ds.Snippet("x.md", 1, "bash", code, None)
    problems = [p for c in ds.shell_commands(snippet) if (p := ds.problem(c, VENV_BIN))]
    assert (found in problems[0]) if found else not problems, problems


def test_the_shell_parser_splits_commands_and_redirects():
    snippet = ds.Snippet("x.md", 1, "bash", "A=1 x --y 'a b' > out.jsonl && (cd infra && z \\\n  w)  # c", None)
    commands = ds.shell_commands(snippet)
    assert [(c.env, c.argv, c.stdout, c.cwd) for c in commands] == [
        ({"A": "1"}, ("x", "--y", "a b"), "out.jsonl", "."),
        ({}, ("cd", "infra"), None, "."),
        ({}, ("z", "w"), None, "infra"),
    ]


INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def test_inline_install_and_python_commands_name_the_checkouts_venv():
    """`pip install …` or `python …` in prose installs into, or runs, whatever
    is first on PATH; the docs name .venv/bin/… (or infra/dev.sh) instead."""
    found = [
        f"{path.relative_to(ROOT)}: `{span}`"
        for path in ds.doc_files()
        for span in INLINE_CODE.findall(path.read_text())
        if re.match(r"(pip3? install|python3? (-m|\S+\.py))\b", span)
    ]
    assert not found, found


def test_docs_name_the_clients_dependencies():
    """What `memq` without extras installs, as pyproject.toml lists it."""
    import tomllib

    deps = [
        re.split(r"[\s<>=!~\[;]", d, maxsplit=1)[0]
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    numbers = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
    for page in ("docs/quickstart.md", "docs/guide/client.md"):
        text = " ".join((ROOT / page).read_text().split())
        missing = [d for d in deps if d not in text]
        assert not missing, f"{page} does not name the client's dependencies {missing}"
        for word in re.findall(rf"\b({'|'.join(numbers)}) dependencies\b", text, re.I):
            assert numbers.index(word.lower()) == len(deps), f"{page}: {word} dependencies, pyproject.toml has {deps}"


def test_quickstart_says_what_the_token_total_adds_to_the_parts():
    """The quickstart prints ctx.tokens (`memq context` a table of it): its
    total is more than the parts, and the pages say by how much, as the code
    counts it."""
    from memq.workers.memory.context import assemble, item_from_event
    from memq.workers.memory.strategies import Strategy

    events = {
        seq: {"id": f"e{seq}", "author": role, "message": {"role": role, "parts": [{"type": "text", "text": text}]}}
        for seq, (role, text) in enumerate([("user", "Hi! A trip to Lisbon in May."), ("assistant", "Lovely.")], 1)
    }
    ctx = assemble(
        history=[item_from_event(seq, e) for seq, e in events.items()],
        events=events,
        strategy=Strategy(kind="token_window", budget=4000),
        summary="Ann plans a trip.",
        instruction="Be brief.",
    )
    parts = ctx.tokens.to_dict()
    extra = parts.pop("total") - sum(parts.values())
    for page in ("quickstart.md", "guide/queries.md"):
        text = " ".join((DOCS / page).read_text().split())
        stated = re.search(r"`total` is the parts plus (\d+)", text)
        assert stated, f"docs/{page}: say what `total` adds to the parts (`total` is the parts plus N …)"
        assert int(stated.group(1)) == extra, page


def test_inline_commands_of_the_checkout_parse():
    """`bash infra/dev.sh …` and `.venv/bin/memq …` in prose get the shell
    blocks' checks."""
    spans = [
        (path, span)
        for path in ds.doc_files()
        for span in INLINE_CODE.findall(path.read_text())
        if span.startswith(("bash infra/", ".venv/bin/memq "))
    ]
    assert len(spans) >= 5, spans
    problems = [
        f"{path.relative_to(ROOT)}: `{span}`: {p}"
        for path, span in spans
        for c in ds.shell_commands(ds.Snippet(str(path.relative_to(ROOT)), 0, "bash", span, None))
        if (p := ds.problem(c, VENV_BIN))
    ]
    assert not problems, problems

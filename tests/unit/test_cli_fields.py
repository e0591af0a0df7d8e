"""Each read command of `memq` has an option for every field of its contract
request, with the field's bounds (taken from the contract's model here, not
from the schema the CLI reads) and default: a field added to a request and not
exposed, or a bound that differs, fails here."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

import pytest
import typer
from pydantic import BaseModel
from typer.main import get_command
from typer.testing import CliRunner

from memq.contracts.queries import OPS, StrategySpec
from memq.workers.cli import app
from memq.workers.cli.reads import RoleOpt
from memq.workers.http.params import bounds

# memq's read commands and the op each sends.
READS = {
    "sessions list": "sessions.list",
    "sessions show": "session.get",
    "history": "history",
    "context": "context",
    "search": "search",
}
# Request fields no option sets, and why.
FILLED = {
    "v": "the protocol version",
    "wait_ms": "the client's own",
    "consistency": "the client's own: a one-shot command has no writes to see",
    "carried": "the client's unconfirmed writes: a one-shot command has none",
    "cursor": "the command follows the pages itself (sessions list: --all)",
    "events": "implied by --events, --after-seq, --after and --role",
}
# An option that takes more than its field, with the bounds it takes, and why.
WIDER = {
    ("search", "min_seq"): ({"ge": 0}, "0 is the client's `min_seq=0`: search what is indexed now, sent as no min_seq"),
}
# A field whose parameter is named otherwise.
PARAMETER = {"app": "app_id", "strategy.kind": "strategy"}


def command(path: str) -> Any:
    found: Any = get_command(app)
    for name in path.split():
        found = found.commands[name]
    return found


def request_fields(op: str) -> list[tuple[str, type[BaseModel], str]]:
    """(field path, model, field name): a strategy's fields are flat options."""
    model = OPS[op].request
    out: list[tuple[str, type[BaseModel], str]] = []
    for name in model.model_fields:
        if name == "strategy":
            out += [(f"strategy.{sub}", StrategySpec, sub) for sub in StrategySpec.model_fields]
        elif name not in FILLED:
            out.append((name, model, name))
    return out


CASES = [(path, *field) for path, op in READS.items() for field in request_fields(op)]


def _accepts(cmd: Any, param: Any, value: Any) -> bool:
    ctx = cmd.make_context(cmd.name, [], resilient_parsing=True)
    try:
        param.process_value(ctx, value)
    except typer.BadParameter:
        return False
    return True


def _edges(found: dict[str, Any], is_int: bool, is_list: bool) -> list[tuple[Any, bool]]:
    """(value, accepted) on each side of each bound."""
    step = 1 if is_int else 0.001
    edges: list[tuple[Any, bool]] = []
    for key, bound in found.items():
        if key == "ge":
            edges += [(bound - step, False), (bound, True)]
        elif key == "le":
            edges += [(bound + step, False), (bound, True)]
        elif key == "gt":
            edges += [(bound, False), (bound + step, True)]
        elif key == "lt":
            edges += [(bound, False), (bound - step, True)]
        elif key in ("min_length", "max_length"):
            item = ["user"] if is_list else "x"
            over = bound + 1 if key == "max_length" else bound - 1
            edges += [(item * over, False), (item * bound, True)]
    if is_list:
        edges = [(tuple(v), ok) for v, ok in edges]
    return edges


@pytest.mark.parametrize(("path", "field", "model", "name"), CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_every_request_field_has_its_option_with_the_contracts_bounds(path, field, model, name):
    cmd = command(path)
    params = {p.name: p for p in cmd.params}
    wanted = PARAMETER.get(field, name)
    assert wanted in params, f"`memq {path}` has no option for {model.__name__}.{name} (or list it in FILLED)"
    param = params[wanted]
    info = model.model_fields[name]
    if info.default is not None and not info.is_required() and info.default_factory is None:
        assert param.default == info.default, f"--{wanted}'s default is not {model.__name__}.{name}'s"
    found = WIDER[path, field][0] if (path, field) in WIDER else bounds(model, name)
    is_list = bool(getattr(param, "multiple", False))
    annotation = str(info.annotation)
    for value, ok in _edges(found, is_int="int" in annotation and "float" not in annotation, is_list=is_list):
        assert _accepts(cmd, param, value) is ok, f"`memq {path}` --{wanted} {value!r}: {model.__name__}.{name} {found}"


def test_an_out_of_range_value_is_a_usage_error_before_anything_is_sent(tmp_path, monkeypatch):
    """No NATS here: a command that got past its options would fail otherwise (exit 1)."""
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    for args, says in (
        (["context", "s", "-u", "u", "--recall-limit", "101"], "0<=x<=100"),
        (["history", "s", "-u", "u", "--window", "100001"], "1<=x<=100000"),
        (["history", "s", "-u", "u", "--threshold", "0"], "0<x<=1"),
        (["search", "", "-u", "u"], "at least 1"),
        # A typo in a choice is refused, with the choices, rather than matching nothing.
        (["search", "q", "-u", "u", "--role", "asistant"], "'asistant' is not one of 'user', 'assistant', "),
        (["history", "s", "-u", "u", "--role", "user", "--role", "summary"], "'summary' is not one of"),
        (["sessions", "show", "s", "-u", "u", "--role", "robot"], "'robot' is not one of"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert says in result.output, (args, result.output)


def test_a_repeated_choice_option_reaches_the_command_as_its_choices():
    """--role goes through the bounds' callback (at most N times); typer
    converts the callback's result again, which turned each role into None
    (the CLI then failed on every --role)."""
    got: list[Any] = []
    probe = typer.Typer()

    @probe.command()
    def show(roles: RoleOpt = None) -> None:
        got.append(roles)

    result = CliRunner().invoke(probe, ["--role", "user", "--role", "assistant"])
    assert result.exit_code == 0, result.output
    assert got[0] == ["user", "assistant"]


def literal_values(annotation: Any) -> set[Any]:
    """The values of the Literals in a field's type (``list[Role] | None``: Role's)."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return set().union(*(literal_values(a) for a in get_args(annotation)))


CHOICES = [c for c in CASES if literal_values(c[2].model_fields[c[3]].annotation)]


@pytest.mark.parametrize(("path", "field", "model", "name"), CHOICES, ids=[f"{c[0]}: {c[1]}" for c in CHOICES])
def test_an_option_of_a_literal_field_takes_the_contracts_values_and_no_other(path, field, model, name):
    """Each value the contract's model takes, and nothing else: a value the
    model refuses would fail after connecting (exit 1), or not at all."""
    cmd = command(path)
    param = {p.name: p for p in cmd.params}[PARAMETER.get(field, name)]
    values = literal_values(model.model_fields[name].annotation)
    multiple = getattr(param, "multiple", False)
    for value in (*sorted(values), "x" + min(values)):
        ok = _accepts(cmd, param, (value,) if multiple else value)
        assert ok is (value in values), f"`memq {path}` --{param.name} {value!r}: {sorted(values)}"

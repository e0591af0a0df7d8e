"""Every error memq raises on purpose ends a command in one line, exit 1
(issue 40): `memq demo` died in a 150-line traceback on a
``PublishOutcomeUnknown``, which no command's handler listed. The CLI's app
maps them all (memq.workers.cli.common.failure_line); this enumerates memq's
error classes, so a new one cannot be left out."""

from __future__ import annotations

import importlib
import pkgutil

import nats.errors
import pytest
import typer

import memq.contracts
from memq.contracts.errors import MemqError
from memq.workers.cli import common


def _subclasses(base: type) -> set[type]:
    found, todo = set(), [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def memq_error_classes() -> list[type[Exception]]:
    """MemqError and every subclass in memq's modules that define errors
    (the contracts, whatever they import, the pure logic), and the NATS
    failures the commands raise."""
    for module in pkgutil.walk_packages(memq.contracts.__path__, "memq.contracts."):
        if ".adapters" not in module.name:  # adapters need their frameworks; they raise the contracts' errors
            importlib.import_module(module.name)
    for name in ("memq.workers.memory.template", "memq.workers.runtime.bus", "memq.workers.runtime.embedded_nats"):
        importlib.import_module(name)
    from memq.workers.runtime.bus import NatsTLSError
    from memq.workers.runtime.embedded_nats import EmbeddedError, NatsNotFound

    classes = {MemqError, *_subclasses(MemqError), EmbeddedError, NatsNotFound, NatsTLSError}
    return sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")


CLASSES = memq_error_classes()
NATS_CLASSES = sorted(
    (c for c in {nats.errors.Error, *_subclasses(nats.errors.Error)} if c.__module__.startswith("nats.")),
    key=lambda c: c.__qualname__,
)
LONG = "; ".join(["outcome unknown after 30.0s of tries"] * 6)  # wider than any terminal


def test_the_enumeration_finds_the_errors_of_the_issue():
    names = {c.__name__ for c in CLASSES}
    assert {"PublishOutcomeUnknown", "PublishFailed", "NatsUnreachable", "Conflict", "TemplateKeyError"} <= names
    assert len(CLASSES) >= 20


@pytest.mark.parametrize("cls", CLASSES + NATS_CLASSES, ids=lambda c: c.__qualname__)
def test_each_error_class_ends_a_command_in_one_line(cls, capsys):
    try:
        exc = cls(LONG)
    except TypeError:  # nats-py errors that take no message, or fields of their own
        try:
            exc = cls()
        except TypeError:
            pytest.skip(f"{cls.__qualname__} is built by nats-py with fields of its own (a subscription's)")
    try:
        str(exc)
    except TypeError:
        pytest.skip(f"{cls.__qualname__} is built by nats-py with fields of its own (sequences)")
    cli = common._App()

    @cli.command()
    def fails() -> None:
        raise exc

    @cli.command()
    def other() -> None:  # two commands: typer then takes the name
        pass

    with pytest.raises(SystemExit) as exited:
        cli(["fails"], prog_name="memq")
    assert exited.value.code == 1
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err
    if isinstance(exc, MemqError):
        assert exc.message in lines[0], lines[0]  # the code first, but NATS' own say where and what to check


def test_a_bug_keeps_its_traceback():
    cli = common._App()

    @cli.command()
    def fails() -> None:
        raise KeyError("a bug")

    @cli.command()
    def other() -> None:
        pass

    with pytest.raises(KeyError):
        cli(["fails"], prog_name="memq", standalone_mode=True)


def test_typer_exits_pass_through():
    cli = common._App()

    @cli.command()
    def fails() -> None:
        raise typer.Exit(3)

    @cli.command()
    def other() -> None:
        pass

    with pytest.raises(SystemExit) as exited:
        cli(["fails"], prog_name="memq")
    assert exited.value.code == 3

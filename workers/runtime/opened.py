"""What a component's ``open()`` sets, read with a clear error before it ran.

A worker component is made before the process connects and is handed its
connection and shared resources in ``open()``; attributes set there are
``None`` until then. Reading one through :func:`opened` gives its real type
to the code after ``open()`` and a message naming it to code that runs too
early, instead of an ``AttributeError`` on ``None``. (The same holds for
what ``router()`` declares, such as a publisher: ``by`` says which.)
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def opened(value: T | None, what: str, *, by: str = "open()") -> T:
    """``value``, which ``by`` sets; ``what`` names it in the error."""
    if value is None:
        raise RuntimeError(f"{what} used before {by}")
    return value

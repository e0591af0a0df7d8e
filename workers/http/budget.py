"""How much JSON a request body may make a server build: its elements and
its nesting depth, counted on the raw bytes as they arrive (pure, no I/O).

A body under the byte cap can still be costly: 4 MiB of ``[{},{},…]`` is
1.4 million objects, about 100 MB and 150 ms of parsing on the event loop
before any model can say "too many". :class:`JsonBudget` counts what a parser
would build without building it, one received chunk at a time, so a body
over the budget is refused as soon as the chunk that passes it arrives (its
rest is never read) and no chunk costs more than a few C passes over its own
bytes: other requests on the loop wait for no long scan.

What counts, outside strings: each ``{``, ``[`` and ``,`` is one element
(an upper bound on the values a parser makes: a member after a comma, a
container), and the depth is the deepest nesting of ``[``/``{``. Strings are
found as a JSON lexer finds them: escape pairs (``\\\\``) go first, then
escaped quotes, and every quote left opens or closes one. A backslash
outside a string is a syntax error the parser stops at, so what follows it
is never built whatever this count makes of it.
"""

from __future__ import annotations

from itertools import accumulate

_OUTSIDE_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256  # a bracket's change of depth
for _open in b"[{":
    _STEP[_open] = 1
for _close in b"]}":
    _STEP[_close] = -1


class OverBudget(ValueError):
    """A body's JSON is over an element or depth limit; the message names it."""


class JsonBudget:
    """The count of one body, fed its chunks in order (see the module doc).

    :param max_elements: elements a body may hold (``http.max_json_elements``).
    :param max_depth: nesting it may reach (``http.max_json_depth``).
    """

    def __init__(self, max_elements: int, max_depth: int):
        self.max_elements = max_elements
        self.max_depth = max_depth
        self.elements = 0
        self.depth = 0  # where the bytes fed so far leave the nesting
        self.deepest = 0
        self._in_string = False
        self._escaped = False  # the last chunk ended on a backslash that escapes this one's first byte

    def feed(self, chunk: bytes) -> None:
        """Count ``chunk``, the next bytes of the body.

        :raises OverBudget: the body so far passes a limit.
        """
        if self._escaped and chunk:
            chunk, self._escaped = chunk[1:], False
        trailing = len(chunk) - len(chunk.rstrip(b"\\"))
        if trailing % 2:  # an escape split across chunks: its byte comes next
            chunk, self._escaped = chunk[:-1], True
        bare = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
        pieces = bare.split(b'"')
        outside = b"".join(pieces[1 if self._in_string else 0 :: 2])
        if len(pieces) % 2 == 0:  # an odd number of quotes: the string state flips
            self._in_string = not self._in_string
        self.elements += outside.count(b"{") + outside.count(b"[") + outside.count(b",")
        if self.elements > self.max_elements:
            raise OverBudget(
                f"the request body's JSON has more than {self.max_elements} elements (http.max_json_elements): "
                "send fewer events or smaller values per request"
            )
        brackets = outside.translate(None, _OUTSIDE_BRACKETS)
        if brackets:  # at most max_elements of them in all, by the check above
            self.deepest = max(self.deepest, max(accumulate(map(_STEP.__getitem__, brackets), initial=self.depth)))
            self.depth += len(brackets) - 2 * (brackets.count(b"]") + brackets.count(b"}"))
        if self.deepest > self.max_depth:
            raise OverBudget(f"the request body's JSON nests deeper than {self.max_depth} levels (http.max_json_depth)")

"""The HTTP gateway's OpenAPI document, committed as ``contracts/openapi.json``
(served live at ``/openapi.json``, with ``/docs``). Regenerate it with
``python -m memq.workers.http.openapi``; tests/unit/test_openapi.py fails
when the committed one is stale."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import memq.contracts
from memq.workers.http.api import build_api
from memq.workers.http.keys import Keyring

DEFAULT_PATH = Path(memq.contracts.__file__).with_name("openapi.json")
COMMAND = "python -m memq.workers.http.openapi"


def document() -> dict[str, Any]:
    """The document of the routes: it does not depend on settings or keys."""

    def no_client(app: str) -> Any:
        raise AssertionError("building the document calls no route")

    return build_api(Keyring({}), no_client).openapi()


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def write(path: Path = DEFAULT_PATH) -> Path:
    path.write_text(render(document()), encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    print(write(Path(argv[0]) if argv else DEFAULT_PATH))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

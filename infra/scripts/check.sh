#!/usr/bin/env bash
# Static checks: ruff (lint and format), mypy, and the import layering.
# Run through `bash infra/dev.sh check`, which sets up .venv first; every
# check runs, and the script fails if any of them did.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

BIN=.venv/bin
failed=()

run() {  # run NAME CMD...: print a header, remember a failure, go on
  local name=$1
  shift
  echo "--- $name"
  "$@" || failed+=("$name")
}

run "ruff check" "$BIN/ruff" check contracts workers tests
run "ruff format" "$BIN/ruff" format --check contracts workers tests

# mypy finds modules by their folders, and no folder here is called memq: the
# installed names (memq.contracts, memq.workers) come from a package mapping in
# pyproject.toml. A tree of links spells them (kept in mypy's cache folder, so
# that its cache stays valid between runs); the output names the repository's
# paths. memq/__init__.py makes mypy take `schemas.py` over the `schemas/`
# folder of JSON beside it, as Python's import does.
types() {
  local tree=.mypy_cache/tree
  mkdir -p "$tree/memq"
  touch "$tree/memq/__init__.py"
  ln -sfn "$PWD/contracts" "$tree/memq/contracts"
  ln -sfn "$PWD/workers" "$tree/memq/workers"
  MYPYPATH=$tree "$BIN/mypy" -p memq.contracts -p memq.workers 2>&1 | sed "s|^$tree/memq/||"
  return "${PIPESTATUS[0]}"
}
run "mypy" types

if grep -q '^\[tool\.importlinter\]' pyproject.toml; then
  # infra/scripts holds the contract types that read the kinds' registry
  PYTHONPATH="infra/scripts${PYTHONPATH:+:$PYTHONPATH}" run "import layering" "$BIN/lint-imports" --no-cache
fi

if ((${#failed[@]})); then
  echo "check: failed: ${failed[*]}" >&2
  exit 1
fi
echo "check: all passed"

"""Run a Python program only as far as its command line: exit 0 once
argparse accepts the arguments, 2 with argparse's message when it does not,
1 if the program never parsed them (it would have run: treated as a failure).

    python tests/argparse_only.py PROGRAM [ARGS...]   (a .py file or a console script)

What tests/integration/test_doc_snippets.py checks the documentation's
`.venv/bin/python tests/run_bench.py NAME --quick`-style commands with, without
running a benchmark.
"""

import argparse
import os
import runpy
import sys

_parse_args = argparse.ArgumentParser.parse_args


def _parsed_then_exit(self, args=None, namespace=None):
    _parse_args(self, args, namespace)  # exits 2 with the usage error
    sys.stdout.flush()
    raise SystemExit(0)


if __name__ == "__main__":
    argparse.ArgumentParser.parse_args = _parsed_then_exit  # type: ignore[method-assign]
    program = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(program))  # as `python PROGRAM` has it
    runpy.run_path(program, run_name="__main__")
    sys.exit(f"{program} never parsed its arguments with argparse")

"""memq's benchmarks and their shared parts; each benchmark runs by name with
``.venv/bin/python tests/run_bench.py NAME ...`` (docs/benchmarks/index.md)."""

"""Benchmarks: each script runs as ``python3 bench/<name>.py`` from a checkout and prints a table,
or one JSON line with ``--json``. A script puts the repository root first on ``sys.path`` and
imports its helpers as ``bench.<module>``, the product as ``gpupool.<package>``; the tests import
them the same way."""

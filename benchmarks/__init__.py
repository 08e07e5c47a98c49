"""Benchmarks of compactlog against SQLite and raw file I/O (``make bench``).

``python -m benchmarks.run`` runs every workload, prints one table and writes
``docs/benchmarks.md`` with a plot; ``--quick`` is a small smoke run.
"""

"""The log engine: the writer and its fast paths, open-time recovery, reading, waiting,
subscribers, snapshots, the latest state and the store's invariants.

Imports ``storage/``, ``encoding/`` and the base modules (``tests/test_layers.py``);
docs/architecture.md.
"""

"""Files: every file of a log directory and the protocols that change them (names, the I/O
seam, segments and indexes, ``.lock``, state files, the tail, the active segment, syncs,
the swap of cleaned segments, retention, listing log directories).

Imports only ``encoding/`` and the base modules (``tests/test_layers.py``);
docs/architecture.md.
"""

"""Bytes: the on-disk grammar, records into batches and batches into columns, the CRC
engines, key digests and the serializers of keys and values.

Imports nothing of the layers above (``tests/test_layers.py``); docs/architecture.md.
"""

"""Bytes: the on-disk grammar, records into batches and batches into columns, the CRC
engines, key digests, the serializers of keys and values and the decoder of versioned JSON
documents.

Imports nothing of the layers above (``tests/test_layers.py``); docs/architecture.md.
"""

"""Which log of a partitioned directory a key belongs to, without Spark.

A partitioned directory holds logs ``partition-0`` .. ``partition-<N-1>``
(:mod:`compactlog.storage.logdirs`). Every writer must send a key to the same log, or a
compacted table would keep two latest values of it: the Spark writer's ``numLogs`` and an
application's own appends route by this module. The rule: 64-bit FNV-1a of the key's
stored bytes (after its ``key_format``: UTF-8 for ``str``, the JSON text for ``json``),
modulo ``N``; a null key goes to partition 0. Stable across versions and machines.

Core library only (numpy, pyarrow): an application routes keys with
:func:`partition_for` and :func:`open_partition` without pyspark installed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import ConfigError, NotALogError

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_MASK = 0xFFFFFFFFFFFFFFFF


def fnv1a64(key: bytes) -> int:
    """The reference definition of the key hash (the vectorized one must agree)."""
    h = int(FNV_OFFSET)
    for byte in key:
        h = ((h ^ byte) * int(FNV_PRIME)) & _MASK
    return h


def partition_for(key: bytes | str | None, count: int) -> int:
    """The partition (``0..count-1``) of one key: its stored bytes' FNV-1a 64 modulo
    ``count`` (a ``str`` is taken as its UTF-8 bytes, as ``key_format="str"`` stores it)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"the number of partitions must be a positive int, not {count!r}")
    if key is None:
        return 0
    if isinstance(key, str):
        key = key.encode("utf-8")
    return fnv1a64(bytes(key)) % count


def key_partitions(keys: pa.Array | pa.ChunkedArray, count: int) -> np.ndarray:
    """The partition (``0..count-1``) of every key of a ``binary`` Arrow array, as
    :func:`partition_for`; null keys go to 0. Vectorized over keys, one step per byte
    position of the longest key."""
    n = len(keys)
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    ends = np.frombuffer(keys.buffers()[1], dtype=np.int32)[keys.offset : keys.offset + n + 1]
    data_buffer = keys.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0)
    starts = ends[:-1].astype(np.int64)
    lengths = (ends[1:] - ends[:-1]).astype(np.int64)
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    for position in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(lengths > position)
        h[live] = (h[live] ^ data[starts[live] + position].astype(np.uint64)) * FNV_PRIME
    result = (h % np.uint64(count)).astype(np.int32)
    if keys.null_count:
        result[keys.is_null().to_numpy(zero_copy_only=False)] = 0
    return result


def partition_path(table: str | os.PathLike[str], key: bytes | str | None) -> str:
    """The log directory of ``key`` in the partitioned directory ``table`` (its logs as they
    are now: their number is fixed once the directory exists)."""
    from .storage.logdirs import list_partitions, partition_dir

    table = os.fspath(table)
    numbers = [n for n, _d in list_partitions(table)]
    if not numbers:
        raise NotALogError("not a directory of partition-<N> logs", path=table)
    if numbers != list(range(len(numbers))):
        raise ConfigError(
            f"the logs of a partitioned directory are partition-0..partition-{len(numbers) - 1}; "
            f"found partitions {', '.join(map(str, numbers))}",
            path=table,
        )
    return partition_dir(table, partition_for(key, len(numbers)))


def open_partition(table: str | os.PathLike[str], key: bytes | str | None, **options: Any) -> Any:
    """``compactlog.open`` of the log ``key`` belongs to in the partitioned directory
    ``table`` (``create=False``: the directory's logs are made by whoever chose their
    number, e.g. the Spark writer's ``numLogs``)."""
    from .log import open_log

    options.setdefault("create", False)
    return open_log(partition_path(table, key), **options)


__all__ = [
    "FNV_OFFSET",
    "FNV_PRIME",
    "fnv1a64",
    "key_partitions",
    "open_partition",
    "partition_for",
    "partition_path",
]

"""Log configuration: names, defaults, validation, and the one gate of a stored change.

Names follow Kafka's topic configs in snake_case, plus JLog's ``precommit_bytes``, workq's
sync policies and Kafka's producer linger (``linger_ms``, ``batch_records``).

Two kinds of setting (``docs/user-guide.md``, sections 3 and 8):

- **stored** settings are properties of the log, kept in its ``meta``: given when the log is
  created, changed afterwards only through :func:`check_change` (``compactlog config set``,
  ``open(..., update_config=True)``). An ordinary open never rewrites them.
- **per-process** settings (:data:`PER_PROCESS`) say how *this* process writes: its fsync
  policy and in-memory batching. One passed to ``open`` of an existing log applies to that
  open only; ``meta`` keeps a default for opens that pass none (set when the log is created,
  or changed like a stored setting).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .errors import ConfigError, UnsafeChangeError, did_you_mean

KIB = 1024
MIB = 1024 * KIB
DAY_MS = 86_400_000
MAX_MERGE_BYTES = 256 * MIB  # cleaner_merge_batch_bytes: 0 (never merge) up to this

CLEANUP_POLICIES = ("compact", "delete", "compact,delete", "consumed")
COMPRESSIONS = ("none", "zstd")
SYNC_POLICIES = ("always", "interval", "os")
SERDE_FORMATS = ("bytes", "str", "json")  # serde.FORMATS (not imported: serde imports config)

# How one process writes, not what the log is: each writer fsyncs its own appends by its own
# policy and holds its own lingering records in memory, so two processes may differ safely.
# (precommit_bytes is not here: the pre_commit file lives in the log, every writer uses it
# and the next writer replays it, so its size is the log's.)
PER_PROCESS = frozenset({"sync", "sync_interval_ms", "linger_ms", "batch_records"})

# Changes refused whatever else holds the log, with the reason shown to the operator.
UNSAFE_CHANGES = {
    "cleanup_policy": (
        "changing the cleanup policy changes which records may be deleted: a compacted log "
        "may hold records retention would now remove, and a delete/consumed log may hold "
        "records without keys that compaction cannot handle; create a new log and copy"
    ),
}

# Settings a writer reads once, when it opens the log, and keeps until it reopens it:
# changing one under a live writer would leave that writer on the old value while the
# stored config claims the new one, so such a change is refused while another writer has the
# log open. Every other setting (retention, the cleaner's ratios, lags and buffers) is read
# afresh by each compaction pass and retention run, so changing it beside live writers is
# safe.
WRITER_CACHED = {
    "segment_bytes": "writers roll segments at the size they read when they opened the log",
    "segment_ms": "writers roll segments by the age they read when they opened the log",
    "index_interval_bytes": "writers index their segments at the interval they read at open",
    "max_record_bytes": (
        "writers check record sizes against the limit they read at open, so a lowered limit "
        "would not stop them"
    ),
    "compression": "writers compress new batches with the codec they read at open",
    "compression_level": "writers compress new batches at the level they read at open",
    "sync": (
        "writers keep the sync policy they read at open, so the log would be less (or more) "
        "durable than the stored config says"
    ),
    "sync_interval_ms": "writers keep the fsync interval they read at open",
    "precommit_bytes": "writers size their precommit buffer when they open the log",
    "min_free_bytes": "writers check free disk space against the limit they read at open",
    "key_format": "writers serialize keys in the format they read at open",
    "value_format": "writers serialize values in the format they read at open",
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Every setting of one log. ``None`` means "no limit" where a limit is optional."""

    segment_bytes: int = 64 * MIB
    segment_ms: int | None = 7 * DAY_MS
    index_interval_bytes: int = 4 * KIB
    max_record_bytes: int = 8 * MIB
    cleanup_policy: str = "compact"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int | None = None
    delete_retention_ms: int = DAY_MS
    retention_ms: int | None = 7 * DAY_MS
    retention_bytes: int | None = None
    compression: str = "none"
    compression_level: int = 3
    sync: str = "interval"
    sync_interval_ms: int = 1000
    precommit_bytes: int = 0
    linger_ms: int = 0
    batch_records: int = 1000
    cleaner_buffer_bytes: int = 32 * MIB
    cleaner_io_bytes_per_second: int | None = None
    cleaner_merge_batch_bytes: int = 1 * MIB
    min_free_bytes: int = 16 * MIB
    key_format: str = "bytes"  # declared formats (serde.py): what readers decode by default
    value_format: str = "bytes"

    # -- derived -------------------------------------------------------------------------
    @property
    def compacted(self) -> bool:
        """Whether the cleanup policy keeps the latest record per key (``"compact"`` in it)."""
        return "compact" in self.cleanup_policy

    @property
    def deletes_by_retention(self) -> bool:
        """Whether old segments are deleted by time or size (``"delete"`` in the policy)."""
        return "delete" in self.cleanup_policy

    @property
    def deletes_when_consumed(self) -> bool:
        """Whether segments every durable subscriber has read are deleted (``"consumed"``)."""
        return self.cleanup_policy == "consumed"

    # -- construction --------------------------------------------------------------------
    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The setting names, in the order of the fields."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> LogConfig:
        """The defaults with ``values`` applied, validated (``ConfigError`` naming the setting)."""
        return cls().merged(values)

    def merged(self, changes: Mapping[str, Any]) -> LogConfig:
        """A copy with ``changes`` applied, validated as a whole."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise ConfigError(
                f"unknown config name(s) {', '.join(unknown)}; known: {', '.join(self.names())}"
                + "".join(did_you_mean(name, self.names()) for name in unknown)
            )
        config = replace(self, **dict(changes))
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        """``{name: value}`` of every setting (what ``meta`` stores)."""
        return asdict(self)

    # -- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`~compactlog.errors.ConfigError` naming the first impossible value."""
        _int("segment_bytes", self.segment_bytes, minimum=KIB, maximum=2 << 30)
        _int("segment_ms", self.segment_ms, minimum=1, optional=True)
        _int("index_interval_bytes", self.index_interval_bytes, minimum=1)
        _int("max_record_bytes", self.max_record_bytes, minimum=1, maximum=1 << 30)
        _choice("cleanup_policy", self.cleanup_policy, CLEANUP_POLICIES)
        ratio = self.min_cleanable_dirty_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            raise ConfigError(
                f"min_cleanable_dirty_ratio must be a number in [0, 1], not {ratio!r}"
            )
        _int("min_compaction_lag_ms", self.min_compaction_lag_ms, minimum=0)
        _int("max_compaction_lag_ms", self.max_compaction_lag_ms, minimum=0, optional=True)
        _int("delete_retention_ms", self.delete_retention_ms, minimum=0)
        _int("retention_ms", self.retention_ms, minimum=0, optional=True)
        _int("retention_bytes", self.retention_bytes, minimum=0, optional=True)
        _choice("compression", self.compression, COMPRESSIONS)
        _int("compression_level", self.compression_level, minimum=-7, maximum=22)
        _choice("sync", self.sync, SYNC_POLICIES)
        _int("sync_interval_ms", self.sync_interval_ms, minimum=1)
        _int("precommit_bytes", self.precommit_bytes, minimum=0, maximum=1 << 30)
        if 0 < self.precommit_bytes < 4 * KIB:
            raise ConfigError(
                f"precommit_bytes must be 0 or at least 4096, not {self.precommit_bytes}"
            )
        _int("linger_ms", self.linger_ms, minimum=0, maximum=60_000)
        _int("batch_records", self.batch_records, minimum=1, maximum=1_000_000)
        if self.linger_ms and self.precommit_bytes:
            raise ConfigError(
                "linger_ms and precommit_bytes both buffer single appends; set one of them "
                "(precommit_bytes is the crash-safe one)"
            )
        _int("cleaner_buffer_bytes", self.cleaner_buffer_bytes, minimum=4 * KIB)
        _int(
            "cleaner_io_bytes_per_second",
            self.cleaner_io_bytes_per_second,
            minimum=1,
            optional=True,
        )
        _int(
            "cleaner_merge_batch_bytes",
            self.cleaner_merge_batch_bytes,
            minimum=0,
            maximum=MAX_MERGE_BYTES,
        )
        _int("min_free_bytes", self.min_free_bytes, minimum=0)
        _choice("key_format", self.key_format, SERDE_FORMATS)
        _choice("value_format", self.value_format, SERDE_FORMATS)
        if (
            self.max_compaction_lag_ms is not None
            and self.max_compaction_lag_ms < self.min_compaction_lag_ms
        ):
            raise ConfigError("max_compaction_lag_ms must not be below min_compaction_lag_ms")


def _int(
    name: str, value: Any, *, minimum: int, maximum: int | None = None, optional: bool = False
) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "an integer or None" if optional else "an integer"
        raise ConfigError(f"{name} must be {kind}, not {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and at most {maximum}" if maximum is not None else ""
        raise ConfigError(f"{name} must be at least {minimum}{upper}, not {value}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, not {value!r}")


def check_change(
    stored: LogConfig,
    changes: Mapping[str, Any],
    *,
    precommit_pending: bool = False,
    live_writers: str = "",
    remedy: str = "stop the writer first",
    path: str | None = None,
) -> LogConfig:
    """The stored config with ``changes`` applied, or an error saying why not.

    The one gate of every change to a log's stored settings: ``compactlog config set``,
    ``open(..., update_config=True)`` and the cleaner service's overrides all call it, so
    they refuse the same changes with the same words (:class:`UnsafeChangeError`): a setting
    of :data:`UNSAFE_CHANGES`; ``precommit_bytes`` while the precommit buffer holds pending
    records (``precommit_pending``); a setting of :data:`WRITER_CACHED` while other writers
    have the log open (``live_writers`` names them: empty when there are none, or when the
    caller was told to go ahead anyway; ``remedy`` ends that message). Unknown names and bad
    values raise :class:`ConfigError` as :meth:`LogConfig.merged` does.
    """
    try:
        merged = stored.merged(changes)
    except ConfigError as error:
        raise ConfigError(str(error), path=path) from None
    differing = [name for name in changes if getattr(merged, name) != getattr(stored, name)]
    for name in differing:
        if name in UNSAFE_CHANGES:
            raise UnsafeChangeError(f"refusing to change {name}: {UNSAFE_CHANGES[name]}", path=path)
    if "precommit_bytes" in differing and precommit_pending:
        raise UnsafeChangeError(
            "refusing to change precommit_bytes while the precommit buffer holds pending "
            "records; let a writer open and flush the log first",
            path=path,
        )
    cached = [name for name in differing if name in WRITER_CACHED]
    if cached and live_writers:
        reasons = "; ".join(f"{name}: {WRITER_CACHED[name]}" for name in cached)
        raise UnsafeChangeError(
            f"refusing while a writer has the log open ({live_writers}): writers read "
            f"{', '.join(cached)} only when they open the log, so a running writer would keep "
            f"the old value ({reasons}); {remedy}",
            path=path,
        )
    return merged

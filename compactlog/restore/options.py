"""The data source's options, parsed and checked once, with errors that name the option.

Spark hands options over lower-cased and as strings; :func:`parse_options` accepts any
case and turns them into a typed :class:`ReadOptions`, refusing an unknown option with a
"did you mean" and a ``valueSchema`` whose field types are not Spark's (naming the user's
text, before Spark parses the schema built around it). Documented in ``docs/spark.md``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, closest, did_you_mean
from ..storage.filenames import META

MODES = ("latest", "changelog")
VALUE_FORMATS = ("binary", "string", "json")
DEFAULT_SNAPSHOT_RETENTION_MINUTES = 24 * 60

METADATA_DDL = "offset BIGINT, timestamp TIMESTAMP, headers MAP<STRING, BINARY>"

OPTION_NAMES = (
    "mode",
    "asOfOffset",
    "asOfTimestamp",
    "archiveSequence",
    "allowInexact",
    "startOffset",
    "endOffset",
    "keys",
    "keysHex",
    "valueFormat",
    "valueSchema",
    "numPartitions",
    "snapshot",
    "snapshotDir",
    "snapshotRetentionMinutes",
    # streaming (stream.py) and writing (writer.py, partitioned.py)
    "maxRecordsPerTrigger",
    "startingOffsets",
    "stagingDir",
    "numLogs",
)
KNOWN = {"path", "paths", *(name.lower() for name in OPTION_NAMES)}

# The first word of every Spark SQL data type (DDL), for valueSchema's early check and
# the Arrow engine's DDL parser (``ddl.py``, which maps all but the last three).
SPARK_TYPES = (
    "boolean",
    "tinyint",
    "byte",
    "smallint",
    "short",
    "int",
    "integer",
    "bigint",
    "long",
    "float",
    "real",
    "double",
    "decimal",
    "dec",
    "numeric",
    "date",
    "timestamp",
    "timestamp_ntz",
    "timestamp_ltz",
    "string",
    "char",
    "varchar",
    "binary",
    "array",
    "map",
    "struct",
    "interval",
    "void",
    "variant",
)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    path: str
    mode: str = "latest"
    mode_given: bool = False  # mode was an option (a stream refuses an explicit latest)
    as_of: int | None = None
    as_of_time_ms: int | None = None  # archives only: the manifest committed at or before
    archive_sequence: int | None = None  # archives only: exactly this manifest
    allow_inexact: bool = False
    start_offset: int | None = None
    end_offset: int | None = None
    keys: tuple[bytes, ...] | None = None
    value_format: str = "binary"
    value_schema: str | None = None
    num_partitions: int | None = None
    snapshot: bool = True  # read a live log through an implicit snapshot
    snapshot_dir: str | None = None
    snapshot_retention_minutes: int = DEFAULT_SNAPSHOT_RETENTION_MINUTES

    @property
    def changelog(self) -> bool:
        return self.mode == "changelog"


def _int(options: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name} must be at least {minimum}, not {value}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name} must be true or false, not {raw!r}")


def _keys(options: Mapping[str, str]) -> tuple[bytes, ...] | None:
    raw = options.get("keys")
    raw_hex = options.get("keyshex")
    if raw is None and raw_hex is None:
        return None
    keys: list[bytes] = []
    if raw is not None:
        text = str(raw)
        if text.lstrip().startswith("["):
            try:
                items = json.loads(text)
            except ValueError as error:
                raise ConfigError(f"option keys is not a JSON array of strings ({error})") from None
            if not isinstance(items, list) or not all(isinstance(k, str) for k in items):
                raise ConfigError("option keys must be a JSON array of strings")
            keys.extend(k.encode("utf-8") for k in items)
        else:
            keys.extend(k.encode("utf-8") for k in text.split(",") if k != "")
    if raw_hex is not None:
        for item in str(raw_hex).split(","):
            try:
                keys.append(bytes.fromhex(item.strip()))
            except ValueError:
                raise ConfigError(f"option keysHex has a bad hex key {item!r}") from None
    return tuple(dict.fromkeys(keys))


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside ``<>``, ``()`` and quotes (``COMMENT 'a, b'``)."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        else:
            depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0 and not quote:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def json_schema_problem(value_format: str | None, value_schema: str | None) -> str | None:
    """The one rule for JSON values: they become columns only with a schema (DDL), and a
    schema is only for JSON values. Returns the half that is broken, ``"schema"`` (JSON
    without a schema) or ``"format"`` (a schema, values not JSON), else ``None``; ``None``
    as the format means "the declared one", decided later. Each caller (the data source's
    options, ``restore``, the CLI) words the refusal in its own names."""
    if value_format == "json" and not value_schema:
        return "schema"
    if value_schema and value_format not in (None, "json"):
        return "format"
    return None


def check_value_schema(ddl: str) -> None:
    """Refuse a ``valueSchema`` whose fields lack a type, use an unknown type or leave a
    bracket open, naming the user's text. Spark parses the rest (it sees the schema with the
    metadata columns around the user's fields, so its errors would quote that instead)."""

    def bad(why: str) -> ConfigError:
        return ConfigError(f"option valueSchema {ddl!r}: {why}")

    if ddl.count("<") != ddl.count(">") or ddl.count("(") != ddl.count(")"):
        raise bad("unbalanced <> or ()")
    for field in _split_top(ddl.strip().rstrip(",")):
        words = re.findall(r"`[^`]*`|[A-Za-z_][A-Za-z0-9_]*|\S", field.replace(":", " "))
        if len(words) < 2:
            raise bad(f"field {field.strip()!r} needs a name and a type, e.g. 'price DOUBLE'")
        type_name = words[1]
        if type_name.lower() not in SPARK_TYPES:
            raise bad(
                f"field {words[0]} has no Spark type {type_name!r}"
                + (did_you_mean(type_name, SPARK_TYPES) or f" (types: {', '.join(SPARK_TYPES)})")
            )


def _unknown_options(unknown: list[str]) -> ConfigError:
    hints = [match for name in unknown if (match := closest(name, OPTION_NAMES))]
    return ConfigError(
        f"unknown compactlog option(s) {', '.join(unknown)} (known: {', '.join(OPTION_NAMES)})"
        + (f"; did you mean {', '.join(hints)}?" if hints else "")
    )


def declared_value_format(path: str, has_schema: bool) -> str:
    """The ``valueFormat`` a read takes when the user names none: the ``value_format`` the
    log declares (for a directory of ``partition-N`` logs, its first log's; for an archive
    URL, its newest manifest's log), read as :func:`read_as` says. ``binary`` where
    nothing is declared or no log is there yet."""
    from ..storage.logdirs import is_partitioned, list_partitions
    from ..storage.state_files import read_meta
    from .archive_read import is_archive_url

    if is_archive_url(path):
        from .archive_read import declared_value_format as archived

        return read_as(archived(path), has_schema)
    directory = os.path.abspath(path)
    if is_partitioned(directory):
        directory = list_partitions(directory)[0][1]
    if not os.path.exists(os.path.join(directory, META)):
        return "binary"
    return read_as(read_meta(directory).config.value_format, has_schema)


def read_as(declared: str | None, has_schema: bool) -> str:
    """How a declared ``value_format`` reads: ``bytes`` as ``binary``, ``str`` as
    ``string``, ``json`` as ``json`` when a ``valueSchema`` is given, else as ``string``
    (the JSON text: Spark needs a schema to parse it); anything else as ``binary``."""
    if declared == "json":
        return "json" if has_schema else "string"
    return {"str": "string"}.get(declared or "", "binary")


def parse_options(raw: Mapping[str, str]) -> ReadOptions:
    """Typed options from what Spark passes (any case); unknown options are refused."""
    options = {str(k).lower(): v for k, v in raw.items()}
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        raise _unknown_options(unknown)
    path = options.get("path")
    if not path:
        raise ConfigError('no log path: use spark.read.format("compactlog").load(PATH)')
    mode = str(options.get("mode", "latest")).lower()
    if mode not in MODES:
        raise ConfigError(f"option mode must be one of {', '.join(MODES)}, not {mode!r}")
    value_schema = options.get("valueschema") or None
    value_format = str(
        options.get("valueformat") or declared_value_format(str(path), bool(value_schema))
    ).lower()
    if value_format not in VALUE_FORMATS:
        raise ConfigError(
            f"option valueFormat must be one of {', '.join(VALUE_FORMATS)}, not {value_format!r}"
        )
    if json_schema_problem(value_format, value_schema) == "format":
        raise ConfigError("option valueSchema needs valueFormat=json")
    if value_schema is not None:
        check_value_schema(str(value_schema))
    start = _int(options, "startOffset")
    end = _int(options, "endOffset")
    if start is not None and end is not None and end < start:
        raise ConfigError(f"option endOffset ({end}) is below startOffset ({start})")
    partitions = _int(options, "numPartitions", minimum=1)
    retention = _int(options, "snapshotRetentionMinutes", minimum=1)
    return ReadOptions(
        path=str(path),
        mode=mode,
        mode_given="mode" in options,
        as_of=_int(options, "asOfOffset"),
        as_of_time_ms=_time_ms(options.get("asoftimestamp")),
        archive_sequence=_int(options, "archiveSequence"),
        allow_inexact=_bool(options, "allowInexact", False),
        start_offset=start,
        end_offset=end,
        keys=_keys(options),
        value_format=value_format,
        value_schema=str(value_schema) if value_schema else None,
        num_partitions=partitions,
        snapshot=_bool(options, "snapshot", True),
        snapshot_dir=options.get("snapshotdir") or None,
        snapshot_retention_minutes=retention or DEFAULT_SNAPSHOT_RETENTION_MINUTES,
    )


def _time_ms(raw: Any) -> int | None:
    """``asOfTimestamp``: ms since the epoch, or an ISO 8601 time (no zone: UTC)."""
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    if text.isdigit():
        return int(text)
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise ConfigError(
            f"option asOfTimestamp must be ms since the epoch or ISO 8601, not {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def schema_ddl(options: ReadOptions) -> str:
    """The default schema as DDL (Spark parses it, so no JVM call is needed here)."""
    if options.value_format == "json":
        if json_schema_problem(options.value_format, options.value_schema) == "schema":
            raise ConfigError(
                "valueFormat=json needs the value's schema: .option('valueSchema', DDL) or "
                ".schema(...)"
            )
        value = options.value_schema.strip().rstrip(",")
    elif options.value_format == "string":
        value = "value STRING"
    else:
        value = "value BINARY"
    deleted = ", deleted BOOLEAN" if options.changelog else ""
    return f"key BINARY, {value}, {METADATA_DDL}{deleted}"

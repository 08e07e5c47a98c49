"""Looking at the data: ``segments``, ``dump``, ``tail``, ``get``, ``stats``.

All read-only: the log is opened with ``read_only=True`` and no lock is taken, so these run
beside live writers without slowing them.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from .common import (
    encoding_option,
    json_option,
    log_dir,
    open_read_only,
    path_argument,
    raw_option,
)
from .output import (
    decode_input,
    emit_json,
    emit_json_line,
    encode_bytes,
    error_line,
    human_bytes,
    human_count,
    iso_ms,
    print_fields,
    print_table,
    warning_line,
)

# -- segments --------------------------------------------------------------------------------


def _segment_state(summary: Any, next_base: int | None, cleaner_point: int) -> str:
    if summary.active:
        return "active"
    bound = next_base if next_base is not None else summary.next_offset
    if bound is not None and bound <= cleaner_point:
        return "clean"
    if summary.base >= cleaner_point:
        return "dirty"
    return "partly clean"


@click.command()
@path_argument
@json_option
def segments(path: str, as_json: bool) -> int:
    """Every segment: base offset, records, bytes, time range, clean/dirty, and which
    durable subscribers still need it (JLog's pending readers). Exits 1 if a segment is
    unreadable.

    \b
    Examples:
      compactlog segments ./demo-data/log
      compactlog segments ./demo-data/log --json | jq '.segments[].records'
    """
    from compactlog.storage.state_files import read_cleaner_state

    from .scan import summarize_segments

    directory = log_dir(path)
    with open_read_only(directory) as log:
        checkpoints = log.subscribers()
    cleaner_point = read_cleaner_state(directory).first_dirty_offset
    summaries = summarize_segments(directory)
    rows = []
    for i, summary in enumerate(summaries):
        next_base = summaries[i + 1].base if i + 1 < len(summaries) else None
        end = next_base if next_base is not None else summary.next_offset
        pending = sorted(n for n, c in checkpoints.items() if end is None or c < end)
        rows.append(
            {
                "base_offset": summary.base,
                "file": summary.name,
                "records": summary.records,
                "batches": summary.batches,
                "size_bytes": summary.size,
                "index_bytes": summary.index_size,
                "next_offset": summary.next_offset,
                "min_timestamp": summary.min_timestamp,
                "max_timestamp": summary.max_timestamp,
                "active": summary.active,
                "state": _segment_state(summary, next_base, cleaner_point),
                "pending_subscribers": pending,
                "error": summary.error,
            }
        )
    failed = any(row["error"] for row in rows)
    if as_json:
        emit_json({"path": directory, "cleaner_point": cleaner_point, "segments": rows})
        return 1 if failed else 0
    print_table(
        ("base offset", "records", "bytes", "first time", "last time", "state", "pending"),
        (
            (
                row["base_offset"],
                human_count(row["records"]),
                human_bytes(row["size_bytes"]),
                iso_ms(row["min_timestamp"]),
                iso_ms(row["max_timestamp"]),
                row["state"] + (" (UNREADABLE)" if row["error"] else ""),
                ", ".join(row["pending_subscribers"]) or "-",
            )
            for row in rows
        ),
        right=("base offset", "records", "bytes"),
        title=f"{directory}: {len(rows)} segments, cleaner point {cleaner_point}",
    )
    for row in rows:
        if row["error"]:
            warning_line(row["error"])
    return 1 if failed else 0


# -- dump and tail ---------------------------------------------------------------------------


def _record_json(record: Any, encoding: str, key: Any, value: Any) -> dict[str, Any]:
    return {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": key,
        "value": value,
        "tombstone": record.value is None,
        "headers": {k: encode_bytes(v, encoding) for k, v in record.headers.items()}
        if record.headers
        else None,
    }


class Formats:
    """How keys and values are shown: decoded by the log's declared formats (``str`` as
    text; ``json`` as the JSON document in ``--json`` output, as compact JSON text
    otherwise) or, with ``--raw`` or a ``--encoding`` other than ``text``, the stored
    bytes in that encoding. A record that does not decode is shown raw, with a warning
    naming its offset (``undecodable`` counts them)."""

    def __init__(self, log: Any, *, encoding: str, as_json: bool, raw: bool) -> None:
        from compactlog.encoding.serde import RAW

        self.encoding = encoding
        self.as_json = as_json
        self.serde = RAW if raw or encoding != "text" else log.serde
        self.undecodable = 0

    def show(self, stored: Any) -> tuple[Any, Any]:
        """The key and value of a record (as stored: bytes) as they are to be printed."""
        from compactlog.errors import DecodeError

        serde = self.serde
        if serde.deserializes:
            try:
                record = next(serde.convert([stored]))
                return (
                    self._show(record.key, serde.key.label),
                    self._show(record.value, serde.value.label),
                )
            except DecodeError as error:
                self.undecodable += 1
                warning_line(f"{error} (shown as stored)")
        return encode_bytes(stored.key, self.encoding), encode_bytes(stored.value, self.encoding)

    def _show(self, item: Any, label: str) -> Any:
        if item is None:
            return None
        if label == "bytes":
            return encode_bytes(item, self.encoding)
        if label == "json" and not self.as_json:
            return json.dumps(item, ensure_ascii=False, separators=(",", ":"))
        return item


class RecordPrinter:
    """Records as aligned lines (streaming: a table of millions of rows would not fit in
    memory) or as JSON lines; keys and values shown by :class:`Formats`."""

    def __init__(self, *, encoding: str, as_json: bool, width: int, formats: Formats) -> None:
        self.encoding = encoding
        self.as_json = as_json
        self.width = width
        self.formats = formats
        self.key_width = 0
        self.printed = 0

    def header(self) -> None:
        if not self.as_json:
            click.echo(f"{'offset':>{self.width}}  {'timestamp':<24}  key  value")

    def __call__(self, record: Any) -> None:
        self.printed += 1
        key, value = self.formats.show(record)
        if self.as_json:
            emit_json_line(_record_json(record, self.encoding, key, value))
            return
        key = "<no key>" if key is None else key
        self.key_width = min(max(self.key_width, len(key)), 40)
        value = "<tombstone>" if value is None else value
        line = f"{record.offset:>{self.width}}  {iso_ms(record.timestamp):<24}  "
        line += f"{key:<{self.key_width}}  {value}"
        if record.headers:
            shown = ", ".join(
                f"{k}={encode_bytes(v, self.encoding)}" for k, v in record.headers.items()
            )
            line += f"  [{shown}]"
        click.echo(line)


def _matching(batch: Any, key: bytes) -> list[int]:
    """Indexes of the records in ``batch`` whose key is ``key`` (columns, no Record objects)."""
    import numpy as np

    lengths = batch.key_lengths
    candidates = np.flatnonzero(lengths == len(key))
    if not len(candidates):
        return []
    starts = np.cumsum(np.maximum(lengths, 0), dtype=np.int64) - np.maximum(lengths, 0)
    blob = batch.keys_blob
    size = len(key)
    return [int(i) for i in candidates if blob[int(starts[i]) : int(starts[i]) + size] == key]


@click.command()
@path_argument
@click.option("--from", "start", type=click.IntRange(min=0), help="First offset to show.")
@click.option("--to", "end", type=click.IntRange(min=0), help="Stop before this offset.")
@click.option("--key", "key", help="Only records with this key.")
@click.option(
    "--key-encoding",
    type=click.Choice(["text", "hex", "base64"]),
    default="text",
    show_default=True,
    help="How --key is written.",
)
@click.option("-n", "--limit", type=click.IntRange(min=0), help="Show at most this many records.")
@encoding_option
@raw_option
@json_option
def dump(
    path: str,
    start: int | None,
    end: int | None,
    key: str | None,
    key_encoding: str,
    limit: int | None,
    encoding: str,
    raw: bool,
    as_json: bool,
) -> int:
    """Print records: offset, timestamp, key, value (tombstones marked).

    Shows everything readable: a damaged batch is reported on stderr (file and byte) and
    skipped, reading resumes at the next valid batch, and the exit code is 1. With --json,
    prints one JSON object per line: offset, timestamp, key, value, tombstone, headers.
    Keys and values are shown in the log's declared formats (JSON values as JSON); a
    record that does not decode is shown as stored, with a warning, and the exit code is 1.

    \b
    Examples:
      compactlog dump ./demo-data/log --limit 20
      compactlog dump ./demo-data/log --from 1000 --to 1100 -e hex
      compactlog dump ./demo-data/log --key user:000042
      compactlog dump ./demo-data/log --json --encoding base64 | jq -c .
    """
    from .scan import salvage_batches

    wanted = decode_input(key, key_encoding) if key is not None else None
    with open_read_only(path) as log:
        directory = log.directory
        first = log.start_offset if start is None else start
        width = max(len(str(log.end_offset)), 6)
        formats = Formats(log, encoding=encoding, as_json=as_json, raw=raw)
    problems: list[str] = []
    printer = RecordPrinter(encoding=encoding, as_json=as_json, width=width, formats=formats)
    printer.header()
    if limit == 0:
        return 0
    for batch in salvage_batches(directory, first, end, lambda e: problems.append(str(e))):
        if wanted is not None:
            chosen = _matching(batch, wanted)
            if not chosen:
                continue
            records = list(batch.records())
            selected = [records[i] for i in chosen]
        else:
            selected = batch.records()
        for record in selected:
            printer(record)
            if limit is not None and printer.printed >= limit:
                break
        if limit is not None and printer.printed >= limit:
            break
    for problem in problems:
        warning_line(f"skipped unreadable data: {problem}")
    return 1 if problems or formats.undecodable else 0


@click.command()
@path_argument
@click.option(
    "-n",
    "--lines",
    "count",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many of the last records to show first.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as writers append.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    help="With -f: stop after this many seconds (default: until interrupted).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.01),
    default=0.1,
    show_default=True,
    help="With -f: seconds between looks at the log end.",
)
@encoding_option
@raw_option
@json_option
def tail(
    path: str,
    count: int,
    follow: bool,
    timeout: float | None,
    interval: float,
    encoding: str,
    raw: bool,
    as_json: bool,
) -> None:
    """Print the last records; with -f, follow appends from other processes.

    Following only reads: it never takes the writers' lock. Stop with Ctrl-C. With --json,
    prints one JSON object per record per line. Keys and values are shown as dump shows
    them (the log's declared formats).

    \b
    Examples:
      compactlog tail ./demo-data/log
      compactlog tail ./demo-data/log -n 0 -f
      compactlog tail ./demo-data/log -f --json --timeout 60 | jq -c .key
    """
    with open_read_only(path) as log:
        end = log.end_offset
        formats = Formats(log, encoding=encoding, as_json=as_json, raw=raw)
        printer = RecordPrinter(
            encoding=encoding, as_json=as_json, width=max(len(str(end)) + 2, 6), formats=formats
        )
        start = log.start_offset
        window = max(count, 1)
        records: list[Any] = []
        low = end
        while count and low > start:
            low = max(start, end - window)
            records = list(log.read(low, end, raw=True))
            if len(records) >= count:
                break
            window *= 4
        printer.header()
        for record in records[-count:] if count else []:
            printer(record)
        if not follow:
            return
        sys.stdout.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        position = end
        try:
            while deadline is None or time.monotonic() < deadline:
                newest = log.end_offset
                if newest > position:
                    for batch in log.read_batches(position, newest):
                        for record in batch.records():
                            printer(record)
                        position = max(position, batch.next_offset)
                    sys.stdout.flush()
                time.sleep(interval)
        except KeyboardInterrupt:
            return


@click.command()
@path_argument
@click.argument("key")
@click.option(
    "--key-encoding",
    type=click.Choice(["text", "hex", "base64"]),
    default="text",
    show_default=True,
    help="How KEY is written.",
)
@click.option(
    "--as-of",
    type=click.IntRange(min=0),
    help="Latest value among offsets below this end offset (default: the whole log).",
)
@encoding_option
@raw_option
@json_option
def get(
    path: str,
    key: str,
    key_encoding: str,
    as_of: int | None,
    encoding: str,
    raw: bool,
    as_json: bool,
) -> int:
    """Print the latest value of KEY (newest segment first, so recent keys are quick).

    Exits 1 when the key is absent or its latest record is a tombstone. The value is shown
    in the log's declared format (a JSON value as JSON, also in --json output).

    \b
    Examples:
      compactlog get ./demo-data/log user:000042
      compactlog get ./demo-data/log 757365723a303030303432 --key-encoding hex
      compactlog get ./demo-data/log user:000042 --as-of 5000 --json
    """
    wanted = decode_input(key, key_encoding)
    found = None
    with open_read_only(path) as log:
        directory = log.directory
        formats = Formats(log, encoding=encoding, as_json=as_json, raw=raw)
        bases = log.get_segments()
        stop = log.end_offset if as_of is None else as_of
        for i in range(len(bases) - 1, -1, -1):
            base = bases[i]
            if base >= stop:
                continue
            upper = min(bases[i + 1], stop) if i + 1 < len(bases) else stop
            for batch in log.read_batches(base, upper):
                hits = _matching(batch, wanted)
                if hits:
                    found = list(batch.records())[hits[-1]]
            if found is not None:
                break
    shown = encode_bytes(wanted, "text")
    document: dict[str, Any] = {
        "path": directory,
        "key": encode_bytes(wanted, encoding),
        "found": found is not None and found.value is not None,
        "deleted": found is not None and found.value is None,
        "offset": found.offset if found else None,
        "timestamp": found.timestamp if found else None,
        "value": formats.show(found)[1] if found else None,
        "headers": {k: encode_bytes(v, encoding) for k, v in found.headers.items()}
        if found and found.headers
        else None,
    }
    if as_json:
        emit_json(document)
        return 0 if document["found"] else 1
    if found is None:
        error_line(f"{directory}: key {shown!r} not found")
        return 1
    if found.value is None:
        error_line(f"{directory}: key {shown!r} was deleted (tombstone at offset {found.offset})")
        return 1
    print_fields(
        [
            ("key", encode_bytes(wanted, encoding)),
            ("offset", found.offset),
            ("timestamp", iso_ms(found.timestamp)),
            ("value", document["value"]),
        ]
        + ([("headers", document["headers"])] if document["headers"] else [])
    )
    return 0


# -- stats -----------------------------------------------------------------------------------


class DistinctKeys:
    """Distinct-key estimate without a Python object per key kept: a bottom-k sketch of
    64-bit key hashes (exact below ``k`` distinct keys, about 0.4% error above)."""

    def __init__(self, k: int = 1 << 16) -> None:
        import numpy as np

        self.np = np
        self.k = k
        self.kept = np.empty(0, dtype=np.uint64)
        self.pending: list[Any] = []
        self.pending_count = 0
        self.saturated = False

    def add(self, keys: list[bytes | None]) -> None:
        np = self.np
        hashes = np.fromiter((hash(k) for k in keys if k is not None), dtype=np.int64)
        self.pending.append(hashes.view(np.uint64))
        self.pending_count += len(hashes)
        if self.pending_count > 1 << 20:
            self._reduce()

    def _reduce(self) -> None:
        np = self.np
        merged = np.unique(np.concatenate([self.kept, *self.pending]))
        self.pending = []
        self.pending_count = 0
        if len(merged) > self.k:
            self.saturated = True
            merged = merged[: self.k]
        self.kept = merged

    def estimate(self) -> tuple[int, bool]:
        """``(count, exact)``."""
        self._reduce()
        if not self.saturated:
            return len(self.kept), True
        kth = float(self.kept[-1]) / 2.0**64
        return int((self.k - 1) / kth), False


@click.command()
@path_argument
@json_option
def stats(path: str, as_json: bool) -> int:
    """Sizes, records, tombstones, a distinct-key estimate, the dirty ratio and a histogram
    of segment fill (one full read of the log; damaged batches are skipped and reported).

    \b
    Examples:
      compactlog stats ./demo-data/log
      compactlog stats ./demo-data/log --json | jq .distinct_keys
    """
    import os

    import numpy as np

    from compactlog.storage import filenames

    from .scan import dirty_figures, dirty_text, salvage_batches

    with open_read_only(path) as log:
        directory = log.directory
        config = log.config
        start, end = log.start_offset, log.end_offset
        log_start = log.meta.log_start_offset
    sizes: dict[str, int] = {"segments": 0, "indexes": 0, "other": 0}
    segment_sizes = []
    for name in os.listdir(directory):
        kind = filenames.parse_filename(name).kind
        try:
            size = os.path.getsize(os.path.join(directory, name))
        except OSError:
            continue
        if kind is filenames.FileKind.SEGMENT:
            sizes["segments"] += size
            segment_sizes.append(size)
        elif kind is filenames.FileKind.INDEX:
            sizes["indexes"] += size
        else:
            sizes["other"] += size
    records = tombstones = key_bytes = value_bytes = batches = 0
    min_ts: int | None = None
    max_ts: int | None = None
    keys = DistinctKeys()
    problems: list[str] = []
    for batch in salvage_batches(directory, start, None, lambda e: problems.append(str(e))):
        batches += 1
        records += len(batch)
        tombstones += int((batch.value_lengths < 0).sum())
        key_bytes += int(np.maximum(batch.key_lengths, 0).sum())
        value_bytes += int(np.maximum(batch.value_lengths, 0).sum())
        if len(batch):
            low, high = int(batch.timestamps.min()), int(batch.timestamps.max())
            min_ts = low if min_ts is None else min(min_ts, low)
            max_ts = high if max_ts is None else max(max_ts, high)
        keys.add(batch.keys())
    distinct, exact = keys.estimate()
    figures = dirty_figures(directory, config, log_start)
    bins = [(0.25, "0-25%"), (0.5, "25-50%"), (0.75, "50-75%"), (1.0, "75-100%")]
    histogram = {label: 0 for _, label in bins}
    histogram[">100%"] = 0
    for size in segment_sizes:
        fill = size / config.segment_bytes
        label = next((lab for bound, lab in bins if fill <= bound), ">100%")
        histogram[label] += 1
    document = {
        "path": directory,
        "start_offset": start,
        "end_offset": end,
        "records": records,
        "batches": batches,
        "tombstones": tombstones,
        "distinct_keys": distinct,
        "distinct_keys_exact": exact,
        "key_bytes": key_bytes,
        "value_bytes": value_bytes,
        "avg_record_bytes": round((key_bytes + value_bytes) / records, 1) if records else 0,
        "min_timestamp": min_ts,
        "max_timestamp": max_ts,
        "segment_count": len(segment_sizes),
        "segment_bytes": sizes["segments"],
        "index_bytes": sizes["indexes"],
        "other_bytes": sizes["other"],
        **figures,
        "segment_fill_histogram": histogram,
        "unreadable": problems,
    }
    if as_json:
        emit_json(document)
    else:
        print_fields(
            [
                ("path", directory),
                ("offsets", f"{start}..{end}"),
                ("records", human_count(records)),
                ("tombstones", human_count(tombstones)),
                ("distinct keys", ("" if exact else "~") + human_count(distinct)),
                ("key / value bytes", f"{human_bytes(key_bytes)} / {human_bytes(value_bytes)}"),
                ("avg record", f"{document['avg_record_bytes']} B"),
                ("time range", f"{iso_ms(min_ts)} .. {iso_ms(max_ts)}"),
                ("segments", f"{len(segment_sizes)} ({human_bytes(sizes['segments'])})"),
                ("indexes", human_bytes(sizes["indexes"])),
                ("other files", human_bytes(sizes["other"])),
                ("dirty ratio", dirty_text(figures)),
            ]
        )
        click.echo()
        print_table(
            ("segment fill", "segments"),
            histogram.items(),
            right=("segments",),
            title=f"segment sizes vs segment_bytes={human_bytes(config.segment_bytes)}",
        )
    for problem in problems:
        warning_line(f"skipped unreadable data: {problem}")
    return 1 if problems else 0

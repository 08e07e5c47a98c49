"""Record at a time against JLog's C library, side by side in one run (issue 12).

JLog is the model for single-record logging: its C library writes about half a million
records a second from Python. The ``jlog`` sdist on PyPI (1.0.2) carries its C source; its
Python 2 binding does not build on Python 3 but the library does, so on first use this module
builds ``libjlog.so`` into a cache directory::

    pip download --no-deps --no-binary :all: jlog==1.0.2
    tar xzf jlog-1.0.2.tar.gz && cd jlog-1.0.2/jlog
    ./configure          # its last step fails on a missing perl file, after the Makefile
    make libjlog.so

and drives it with ``ctypes``. Where it cannot be built (no compiler, no network), the JLog
rows say why and every other row still runs.

Workload: ``records`` records of a 16-byte key and a 100-byte value (JLog, which has no keys,
stores the 116 bytes as one message). Rows, each one system writing or reading every record:

- the raw Python loop: a 24-byte header (length, CRC-32C, offset, key and value lengths) plus
  key and value, one ``os.write`` per record: the floor for any Python log;
- single ``append`` with the default settings (``sync="interval"``, then ``flush()``), with
  ``exclusive=True``, into a 4 MiB precommit buffer, and with ``linger_ms`` (not crash-safe);
  JLog with its default safety (fsync at segment roll and close) and with ``JLOG_UNSAFE``
  (JLog 1.0.2 has no precommit buffer; unsafe is its fastest single write);
- ``append_batch`` of 1,000 records (and the same log read back);
- reading back the log written by single appends: ``read()`` and ``read_batches()``, JLog's
  reader (``jlog_ctx_read_interval`` + ``jlog_ctx_read_message``), the raw loop's file;
- bytes on disk.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .common import check, make_records

JLOG_VERSION = "1.0.2"
JLOG_BEGIN = 0
JLOG_UNSAFE = 0
JLOG_ALMOST_SAFE = 1
BATCH = 1000
RAW_HEADER = struct.Struct("<IIqii")  # length, crc32c, offset, key length, value length
assert RAW_HEADER.size == 24


# -- building JLog -----------------------------------------------------------------------


class JLogUnavailable(Exception):
    """Why JLog's library could not be built or loaded (shown in its rows)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "compactlog-bench" / f"jlog-{JLOG_VERSION}"


def _run(command: Sequence[str], cwd: Path, what: str, *, check_rc: bool = True) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise JLogUnavailable(f"{what} failed: {error}") from None
    if check_rc and done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise JLogUnavailable(f"{what} failed (exit {done.returncode}): {tail[0]}")


def build_jlog(cache: Path | None = None) -> Path:
    """The path of ``libjlog.so``, built into ``cache`` on first use."""
    cache = cache or cache_dir()
    library = cache / "libjlog.so"
    if library.exists():
        return library
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as work:
        workdir = Path(work)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"jlog=={JLOG_VERSION}",
                "-d",
                str(workdir),
            ],
            workdir,
            "pip download of the jlog sdist",
        )
        archives = list(workdir.glob("jlog-*.tar.gz"))
        if not archives:
            raise JLogUnavailable("pip download produced no jlog sdist")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(workdir, filter="data")
        source = workdir / f"jlog-{JLOG_VERSION}" / "jlog"
        if not (source / "configure").exists():
            raise JLogUnavailable(f"the sdist has no jlog/configure ({source})")
        # its last step fails on a missing perl file after writing the Makefile: harmless
        _run(["sh", "./configure"], source, "./configure", check_rc=False)
        if not (source / "Makefile").exists():
            raise JLogUnavailable("./configure wrote no Makefile (is a C compiler installed?)")
        _run(["make", "libjlog.so"], source, "make libjlog.so")
        shutil.copy2(source / "libjlog.so", library)
    return library


class JLog:
    """The few JLog calls the benchmark needs, through ``ctypes``."""

    class Id(ctypes.Structure):
        _fields_ = [("log", ctypes.c_uint32), ("marker", ctypes.c_uint32)]

    class Header(ctypes.Structure):
        _fields_ = [
            ("reserved", ctypes.c_uint32),
            ("tv_sec", ctypes.c_uint32),
            ("tv_usec", ctypes.c_uint32),
            ("mlen", ctypes.c_uint32),
        ]

    class Message(ctypes.Structure):
        pass

    Message._fields_ = [
        ("header", ctypes.c_void_p),
        ("mess_len", ctypes.c_uint32),
        ("mess", ctypes.c_void_p),
        ("aligned_header", Header),
    ]

    def __init__(self, library: Path) -> None:
        try:
            lib = ctypes.CDLL(str(library))
        except OSError as error:
            raise JLogUnavailable(f"cannot load {library.name}: {error}") from None
        lib.jlog_new.restype = ctypes.c_void_p
        lib.jlog_new.argtypes = [ctypes.c_char_p]
        for name in (
            "jlog_ctx_init",
            "jlog_ctx_open_writer",
            "jlog_ctx_close",
            "jlog_ctx_err",
        ):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_int
        lib.jlog_ctx_alter_safety.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.jlog_ctx_add_subscriber.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        lib.jlog_ctx_open_reader.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.jlog_ctx_write.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.jlog_ctx_read_interval.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(self.Id),
            ctypes.POINTER(self.Id),
        ]
        lib.jlog_ctx_read_message.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(self.Id),
            ctypes.POINTER(self.Message),
        ]
        lib.jlog_ctx_read_checkpoint.argtypes = [ctypes.c_void_p, ctypes.POINTER(self.Id)]
        self.lib = lib

    def create(self, path: Path, subscriber: bytes = b"bench") -> None:
        ctx = self.lib.jlog_new(os.fsencode(path))
        self._ok(self.lib.jlog_ctx_init(ctx), ctx, "jlog_ctx_init")
        self.lib.jlog_ctx_close(ctx)
        ctx = self.lib.jlog_new(os.fsencode(path))
        self._ok(self.lib.jlog_ctx_add_subscriber(ctx, subscriber, JLOG_BEGIN), ctx, "subscriber")
        self.lib.jlog_ctx_close(ctx)

    def writer(self, path: Path, safety: int) -> int:
        ctx = self.lib.jlog_new(os.fsencode(path))
        self._ok(self.lib.jlog_ctx_alter_safety(ctx, safety), ctx, "jlog_ctx_alter_safety")
        self._ok(self.lib.jlog_ctx_open_writer(ctx), ctx, "jlog_ctx_open_writer")
        return ctx

    def read_all(self, path: Path, subscriber: bytes = b"bench") -> tuple[int, int]:
        """Read every message once; returns (messages, bytes)."""
        lib = self.lib
        ctx = lib.jlog_new(os.fsencode(path))
        self._ok(lib.jlog_ctx_open_reader(ctx, subscriber), ctx, "jlog_ctx_open_reader")
        first, last, cur = self.Id(), self.Id(), self.Id()
        message = self.Message()
        read_interval, read_message = lib.jlog_ctx_read_interval, lib.jlog_ctx_read_message
        string_at = ctypes.string_at
        count = size = 0
        try:
            while True:
                n = read_interval(ctx, ctypes.byref(first), ctypes.byref(last))
                if n <= 0:
                    self._ok(n, ctx, "jlog_ctx_read_interval")
                    break
                cur.log, cur.marker = first.log, first.marker
                for _ in range(n):
                    if read_message(ctx, ctypes.byref(cur), ctypes.byref(message)) != 0:
                        raise JLogUnavailable("jlog_ctx_read_message failed")
                    size += len(string_at(message.mess, message.mess_len))
                    count += 1
                    cur.marker += 1
                lib.jlog_ctx_read_checkpoint(ctx, ctypes.byref(last))
        finally:
            lib.jlog_ctx_close(ctx)
        return count, size

    def _ok(self, rc: int, ctx: int, what: str) -> None:
        if rc < 0:
            error = self.lib.jlog_ctx_err(ctx)
            raise JLogUnavailable(f"{what} failed (jlog error {error})")


# -- the workloads -----------------------------------------------------------------------


def directory_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def raw_write(path: Path, records: Sequence[tuple[bytes, bytes]]) -> None:
    """The issue's raw loop: header + key + value, CRC included, one ``os.write`` each."""
    from compactlog.format import crc32c

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write, pack = os.write, RAW_HEADER.pack
    try:
        for offset, (key, value) in enumerate(records):
            body = key + value
            write(fd, pack(24 + len(body), crc32c(body), offset, len(key), len(value)) + body)
    finally:  # no fsync: the loop, the floor (our rows include their final fsync)
        os.close(fd)


def raw_read(path: Path) -> int:
    """Read the raw loop's file back record by record (CRC checked): its reading floor."""
    from compactlog.format import crc32c

    data = path.read_bytes()
    unpack = RAW_HEADER.unpack_from
    pos = count = 0
    while pos < len(data):
        length, crc, _offset, key_length, _value_length = unpack(data, pos)
        body = data[pos + 24 : pos + length]
        check(crc32c(body) == crc, "raw file damaged")
        _key, _value = body[:key_length], body[key_length:]
        pos += length
        count += 1
    return count


class Timer:
    """Runs named steps, keeps (seconds, note) per row; a failing step records why."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.rows: dict[str, tuple[float | None, str]] = {}

    def time(self, name: str, step: Callable[[], Any], note: str = "") -> Any:
        self.say(f"  {name}")
        started = time.perf_counter()
        try:
            result = step()
        except JLogUnavailable as error:
            self.rows[name] = (None, f"JLog unavailable: {error}")
            return None
        self.rows[name] = (time.perf_counter() - started, note)
        return result


def _ours_single(path: Path, records: Sequence[tuple[bytes, bytes]], **options: Any) -> None:
    import compactlog

    exclusive = options.pop("exclusive", False)
    with compactlog.open(path, exclusive=exclusive, **options) as log:
        append = log.append
        for key, value in records:
            append(key, value)
        log.flush()


def _ours_batches(path: Path, records: Sequence[tuple[bytes, bytes]]) -> None:
    import compactlog

    with compactlog.open(path) as log:
        for i in range(0, len(records), BATCH):
            log.append_batch(records[i : i + BATCH])
        log.flush()


def _ours_read(path: Path) -> int:
    import compactlog

    with compactlog.open(path, read_only=True) as log:
        return sum(1 for _ in log.read())


def _ours_read_batches(path: Path) -> int:
    import compactlog

    with compactlog.open(path, read_only=True) as log:
        return sum(len(batch) for batch in log.read_batches())


def _jlog_write(jlog: JLog | None, path: Path, records: Sequence[tuple[bytes, bytes]], safety: int):
    if jlog is None:
        raise JLogUnavailable(UNAVAILABLE[0])
    jlog.create(path)
    ctx = jlog.writer(path, safety)
    write = jlog.lib.jlog_ctx_write
    try:
        for key, value in records:
            message = key + value
            if write(ctx, message, len(message)) != 0:
                raise JLogUnavailable("jlog_ctx_write failed")
    finally:
        jlog.lib.jlog_ctx_close(ctx)


UNAVAILABLE = [""]


def run(
    records: int = 1_000_000,
    root: Path | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every row once (1M records per row take minutes on 2 cores); returns the figures
    and a markdown table (``markdown``) for ``docs/benchmarks.md``."""
    data = make_records(records)
    payload = sum(len(k) + len(v) for k, v in data)
    jlog: JLog | None = None
    try:
        jlog = JLog(build_jlog())
    except JLogUnavailable as error:
        UNAVAILABLE[0] = str(error)
        say(f"JLog unavailable: {error}")
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="jlog-", dir=root))
    timer = Timer(say)
    sizes: dict[str, int | None] = {}
    try:
        p = base / "raw.bin"
        timer.time("write: raw Python loop", lambda: raw_write(p, data))
        sizes["raw Python loop"] = directory_bytes(p)
        timer.time("read: raw Python loop", lambda: check(raw_read(p) == records, "raw read"))

        for name, safety in (("default", JLOG_ALMOST_SAFE), ("unsafe", JLOG_UNSAFE)):
            p = base / f"jlog-{name}"
            timer.time(f"write: JLog {name}", lambda p=p, s=safety: _jlog_write(jlog, p, data, s))
        p = base / "jlog-default"
        if jlog is not None and p.exists():
            sizes["JLog"] = directory_bytes(p)
            timer.time("read: JLog", lambda: check(jlog.read_all(p)[0] == records, "jlog read"))
        else:
            timer.rows["read: JLog"] = (None, f"JLog unavailable: {UNAVAILABLE[0]}")

        singles = base / "ours-default"
        timer.time("write: append() default", lambda: _ours_single(singles, data))
        sizes["compactlog, single appends"] = directory_bytes(singles)
        for name, options in (
            ("exclusive=True", {"exclusive": True}),
            ("4 MiB precommit", {"precommit_bytes": 4 << 20}),
            ("linger_ms=5", {"linger_ms": 5}),
        ):
            p = base / f"ours-{name.split('=')[0].replace(' ', '-')}"
            timer.time(f"write: append() {name}", lambda p=p, o=options: _ours_single(p, data, **o))
        batches = base / "ours-batches"
        timer.time("write: append_batch() x 1,000", lambda: _ours_batches(batches, data))
        sizes["compactlog, batches of 1,000"] = directory_bytes(batches)

        timer.time(
            "read: read() of single appends", lambda: check(_ours_read(singles) == records, "read")
        )
        timer.time(
            "read: read_batches() of single appends",
            lambda: check(_ours_read_batches(singles) == records, "read_batches"),
        )
        timer.time(
            "read: read_batches() of batches",
            lambda: check(_ours_read_batches(batches) == records, "rb"),
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()
    figures = _figures(timer.rows, records)
    figures["bytes_on_disk"] = sizes
    figures["payload_bytes"] = payload
    figures["load_average"] = f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    figures["jlog"] = "built" if jlog is not None else f"unavailable: {UNAVAILABLE[0]}"
    figures["markdown"] = markdown(timer.rows, records, sizes, figures["load_average"])
    return figures


def _figures(rows: dict[str, tuple[float | None, str]], records: int) -> dict[str, Any]:
    return {
        name: (None if seconds is None else round(records / seconds))
        for name, (seconds, _) in rows.items()
    }


ROWS = (
    # (label, our row, JLog row, raw row)
    (
        "write, default durability",
        "write: append() default",
        "write: JLog default",
        "write: raw Python loop",
    ),
    (
        "write, exclusive=True",
        "write: append() exclusive=True",
        "write: JLog default",
        "write: raw Python loop",
    ),
    (
        "write, 4 MiB precommit (JLog: unsafe)",
        "write: append() 4 MiB precommit",
        "write: JLog unsafe",
        "write: raw Python loop",
    ),
    (
        "write, linger_ms=5 (not crash-safe)",
        "write: append() linger_ms=5",
        "write: JLog unsafe",
        "write: raw Python loop",
    ),
    (
        "write, append_batch() x 1,000",
        "write: append_batch() x 1,000",
        "write: JLog default",
        "write: raw Python loop",
    ),
    (
        "read back single appends, read()",
        "read: read() of single appends",
        "read: JLog",
        "read: raw Python loop",
    ),
    (
        "same, read_batches()",
        "read: read_batches() of single appends",
        "read: JLog",
        "read: raw Python loop",
    ),
    (
        "read back batches, read_batches()",
        "read: read_batches() of batches",
        "read: JLog",
        "read: raw Python loop",
    ),
)


def markdown(
    rows: dict[str, tuple[float | None, str]], records: int, sizes: dict[str, int | None], load: str
) -> str:
    def rate(name: str) -> float | None:
        seconds = rows.get(name, (None, ""))[0]
        return None if seconds is None else records / seconds

    def cell(value: float | None) -> str:
        return "n/a" if value is None else f"{value / 1000:,.0f} k/s"

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if a is None or b is None else f"{a / b:.2f}x"

    lines = [
        f"{records:,} records of 16 B keys + 100 B values, each row once, one process; "
        f"load average {load}.",
        "",
        "| record at a time | JLog C | compactlog | raw Python loop | ours / JLog | ours / raw |",
        "|---|---|---|---|---|---|",
    ]
    for label, ours, jlog, raw in ROWS:
        a, j, r = rate(ours), rate(jlog), rate(raw)
        lines.append(
            f"| {label} | {cell(j)} | {cell(a)} | {cell(r)} | {ratio(a, j)} | {ratio(a, r)} |"
        )
    disk = " / ".join(f"{name} {size / 1e6:,.0f} MB" for name, size in sizes.items() if size)
    lines += ["", f"Bytes on disk: {disk}."]
    notes = sorted({note for _, note in rows.values() if note})
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    import json

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    result = run(count)
    print(result.pop("markdown"))
    print(json.dumps(result, indent=1))

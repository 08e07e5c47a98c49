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
from collections.abc import Callable, Generator, Sequence
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
        self.expected = 0  # records a reader must find

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

    def reader(self, path: Path, chunk: int, subscriber: bytes = b"bench") -> Steps:
        """Read every message once, ``chunk`` at a time (see :func:`interleaved`)."""
        lib = self.lib
        ctx = lib.jlog_new(os.fsencode(path))
        self._ok(lib.jlog_ctx_open_reader(ctx, subscriber), ctx, "jlog_ctx_open_reader")
        first, last, cur = self.Id(), self.Id(), self.Id()
        message = self.Message()
        read_interval, read_message = lib.jlog_ctx_read_interval, lib.jlog_ctx_read_message
        string_at, byref = ctypes.string_at, ctypes.byref
        count = 0
        yield
        try:
            left = 0
            while True:
                done = 0
                while done < chunk:
                    if not left:
                        lib.jlog_ctx_read_checkpoint(ctx, byref(last))
                        left = read_interval(ctx, byref(first), byref(last))
                        if left <= 0:
                            break
                        cur.log, cur.marker = first.log, first.marker
                    if read_message(ctx, byref(cur), byref(message)) != 0:
                        raise JLogUnavailable("jlog_ctx_read_message failed")
                    string_at(message.mess, message.mess_len)
                    cur.marker += 1
                    left -= 1
                    done += 1
                count += done
                yield
                if done < chunk:
                    break
        finally:
            lib.jlog_ctx_close(ctx)
        check(count == self.expected, f"JLog read {count} records")

    def _ok(self, rc: int, ctx: int, what: str) -> None:
        if rc < 0:
            error = self.lib.jlog_ctx_err(ctx)
            raise JLogUnavailable(f"{what} failed (jlog error {error})")


# -- the workloads -----------------------------------------------------------------------


def directory_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


Steps = Generator[None, None, None]


CPU: dict[str, float] = {}  # CPU seconds (time.process_time) of each system's timed steps


def interleaved(systems: dict[str, Callable[[], Steps]], say: Callable[[str], None]):
    """Run the systems in rounds, one step of each per round, summing each one's step times.

    Each system is a generator: the code up to its first ``yield`` is untimed setup, each
    later step (a chunk of records, then the final flush) is timed, and what follows its
    last ``yield`` is untimed teardown. Interleaving gives every system the same share of
    whatever else the machine is doing (it has 2 cores shared with other work), so ratios
    taken in one run hold even when absolute figures move. A system that cannot run (JLog
    not built) gets ``None`` and its reason. The CPU time of the same steps (the process's,
    so background threads count) goes into :data:`CPU`: on a loaded machine it is the steadier
    measure, as it leaves out the time the process waited for a core."""
    running: dict[str, Steps] = {}
    times: dict[str, tuple[float | None, str]] = {}
    for name, make in systems.items():
        try:
            steps = make()
            next(steps)
        except JLogUnavailable as error:
            times[name] = (None, f"JLog unavailable: {error}")
            continue
        running[name] = steps
        times[name] = (0.0, "")
    say(f"  {', '.join(running)}")
    while running:
        for name, steps in list(running.items()):
            started, cpu_started = time.perf_counter(), time.process_time()
            try:
                next(steps)
            except StopIteration:
                del running[name]
                continue
            elapsed = time.perf_counter() - started
            CPU[name] = CPU.get(name, 0.0) + time.process_time() - cpu_started
            times[name] = ((times[name][0] or 0.0) + elapsed, "")
    return times


def raw_writer(path: Path, chunks: list[Sequence[tuple[bytes, bytes]]]) -> Steps:
    """The issue's raw loop: header + key + value, CRC included, one ``os.write`` each (no
    fsync: the floor; the compactlog rows include their final fsync)."""
    from compactlog.encoding.format import crc32c

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    write, pack = os.write, RAW_HEADER.pack
    offset = 0
    yield
    try:
        for chunk in chunks:
            for key, value in chunk:
                body = key + value
                write(fd, pack(24 + len(body), crc32c(body), offset, len(key), len(value)) + body)
                offset += 1
            yield
    finally:
        os.close(fd)


def raw_reader(path: Path, chunk: int, expected: int) -> Steps:
    """The raw file read back record by record, CRC checked: the reading floor."""
    from compactlog.encoding.format import crc32c

    data = path.read_bytes()
    unpack = RAW_HEADER.unpack_from
    pos = count = 0
    yield
    while pos < len(data):
        stop = count + chunk
        while pos < len(data) and count < stop:
            length, crc, _offset, key_length, _value_length = unpack(data, pos)
            body = data[pos + 24 : pos + length]
            check(crc32c(body) == crc, "raw file damaged")
            _key, _value = body[:key_length], body[key_length:]
            pos += length
            count += 1
        yield
    check(count == expected, f"raw read {count} records")


def jlog_writer(
    jlog: JLog | None, path: Path, chunks: list[Sequence[tuple[bytes, bytes]]], safety: int
) -> Steps:
    if jlog is None:
        raise JLogUnavailable(UNAVAILABLE[0])
    jlog.create(path)
    ctx = jlog.writer(path, safety)
    write = jlog.lib.jlog_ctx_write
    yield
    closed = False
    try:
        for chunk in chunks:
            for key, value in chunk:
                message = key + value
                if write(ctx, message, len(message)) != 0:
                    raise JLogUnavailable("jlog_ctx_write failed")
            yield
        jlog.lib.jlog_ctx_close(ctx)  # timed: its fsync is JLog's final flush
        closed = True
        yield
    finally:
        if not closed:
            jlog.lib.jlog_ctx_close(ctx)


def ours_writer(
    path: Path, chunks: list[Sequence[tuple[bytes, bytes]]], *, batch: bool = False, **options: Any
) -> Steps:
    import compactlog

    exclusive = options.pop("exclusive", False)
    log = compactlog.open(path, exclusive=exclusive, **options)
    yield
    try:
        append, append_batch = log.append, log.append_batch
        for chunk in chunks:
            if batch:
                for i in range(0, len(chunk), BATCH):
                    append_batch(chunk[i : i + BATCH])
            else:
                for key, value in chunk:
                    append(key, value)
            yield
        log.flush()  # timed: the final flush makes every record durable
        yield
    finally:
        log.close()


def ours_reader(path: Path, chunk: int, expected: int, *, columnar: bool) -> Steps:
    import compactlog

    log = compactlog.open(path, read_only=True)
    count = 0
    yield
    try:
        if columnar:
            rows = 0
            for batch in log.read_batches():
                rows += len(batch)
                if rows >= chunk:
                    count += rows
                    rows = 0
                    yield
            count += rows
        else:
            for i, _record in enumerate(log.read(), 1):
                if i % chunk == 0:
                    yield
                count = i
        yield
    finally:
        log.close()
    check(count == expected, f"compactlog read {count} records")


UNAVAILABLE = [""]


def run(
    records: int = 1_000_000,
    root: Path | None = None,
    say: Callable[[str], None] = print,
    chunk: int = 50_000,
) -> dict[str, Any]:
    """Every row once, the systems interleaved in rounds of ``chunk`` records; returns the
    figures and a markdown table (``markdown``) for ``docs/benchmarks.md``."""
    data = make_records(records)
    chunks = [data[i : i + chunk] for i in range(0, records, chunk)]
    payload = sum(len(k) + len(v) for k, v in data)
    jlog: JLog | None = None
    try:
        jlog = JLog(build_jlog())
        jlog.expected = records
    except JLogUnavailable as error:
        UNAVAILABLE[0] = str(error)
        say(f"JLog unavailable: {error}")
    load_before = os.getloadavg()
    CPU.clear()
    base = Path(tempfile.mkdtemp(prefix="jlog-", dir=root))
    paths = {name: base / name for name in ("raw", "jlog", "jlog-unsafe", "single", "batches")}
    try:
        say("writes")
        rows = interleaved(
            {
                "write: raw Python loop": lambda: raw_writer(paths["raw"], chunks),
                "write: JLog default": lambda: jlog_writer(
                    jlog, paths["jlog"], chunks, JLOG_ALMOST_SAFE
                ),
                "write: JLog unsafe": lambda: jlog_writer(
                    jlog, paths["jlog-unsafe"], chunks, JLOG_UNSAFE
                ),
                "write: append() default": lambda: ours_writer(paths["single"], chunks),
                "write: append() exclusive=True": lambda: ours_writer(
                    base / "exclusive", chunks, exclusive=True
                ),
                "write: append() 4 MiB precommit": lambda: ours_writer(
                    base / "precommit", chunks, precommit_bytes=4 << 20
                ),
                "write: append() linger_ms=5": lambda: ours_writer(
                    base / "linger", chunks, linger_ms=5
                ),
                "write: append_batch() x 1,000": lambda: ours_writer(
                    paths["batches"], chunks, batch=True
                ),
            },
            say,
        )
        sizes = {
            "raw Python loop": directory_bytes(paths["raw"]),
            "JLog": directory_bytes(paths["jlog"]) if paths["jlog"].exists() else None,
            "compactlog, single appends": directory_bytes(paths["single"]),
            "compactlog, batches of 1,000": directory_bytes(paths["batches"]),
        }
        say("reads")
        rows.update(
            interleaved(
                {
                    "read: raw Python loop": lambda: raw_reader(paths["raw"], chunk, records),
                    "read: JLog": lambda: (
                        jlog.reader(paths["jlog"], chunk)
                        if jlog is not None
                        else jlog_writer(None, paths["jlog"], [], 0)
                    ),
                    "read: read() of single appends": lambda: ours_reader(
                        paths["single"], chunk, records, columnar=False
                    ),
                    "read: read_batches() of single appends": lambda: ours_reader(
                        paths["single"], chunk, records, columnar=True
                    ),
                    "read: read_batches() of batches": lambda: ours_reader(
                        paths["batches"], chunk, records, columnar=True
                    ),
                },
                say,
            )
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()
    figures = _figures(rows, records)
    figures["bytes_on_disk"] = sizes
    figures["payload_bytes"] = payload
    figures["load_average"] = f"{load_before[0]:.2f} before, {load_after[0]:.2f} after"
    figures["jlog"] = "built" if jlog is not None else f"unavailable: {UNAVAILABLE[0]}"
    figures["cpu_us_per_record"] = {
        name: round(cpu / records * 1e6, 2) for name, cpu in CPU.items()
    }
    figures["markdown"] = markdown(rows, records, sizes, figures["load_average"])
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
        f"{records:,} records of 16 B keys + 100 B values, one process, every system run in "
        f"interleaved rounds of the same records (so all see the same machine load); load "
        f"average {load}.",
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
    writes = [name for name in CPU if name.startswith("write: ")]
    raw_cpu = CPU.get("write: raw Python loop")
    if writes and raw_cpu:
        lines += [
            "",
            "CPU time per record written (`time.process_time` of the same steps; steadier "
            "than the rates above on a loaded machine):",
            "",
            "| writer | CPU per record | raw loop / this |",
            "|---|---|---|",
        ]
        for name in writes:
            cpu = CPU[name]
            lines.append(f"| {name[7:]} | {cpu / records * 1e6:.2f} us | {raw_cpu / cpu:.2f}x |")
    notes = sorted({note for _, note in rows.values() if note})
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines)


if __name__ == "__main__":
    import json

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    result = run(count)
    print(result.pop("markdown"))
    print(json.dumps(result, indent=1))

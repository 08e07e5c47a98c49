"""The checks every crash state must pass, and the failures they report.

A state is copied twice to fresh directories and opened, without ``repair``. The first copy
is opened read-only twice, before any writable open: under the boot id that stored its
``.lock`` (data lost under a running machine: a FUSE daemon that died, an NFS server with
async exports that restarted) and under another (a power loss is a reboot); neither may
change a file. The second is opened writable, then read-only again. On each:

1. the open succeeds (any exception, ``NotALogError``, ``CorruptLogError``,
   ``MissingSegmentError`` or other, is a failure; only a brand-new log with nothing
   acknowledged may still be no log at all);
2. what is read is exactly the first k records written, in order, with their offsets,
   k >= the number acknowledged: no garbage, no holes, no reordering (``prefix``); after
   retention, a contiguous run of them ending at or past the acknowledged ones
   (``suffix``); after compaction, records written, in offset order, including the latest
   acknowledged record of every key (``latest``, Kafka's guarantee); the end offset is
   at least the acknowledged end;
3. every durable subscriber checkpoint is at most the log's end offset, and at least
   the offset of the subscriber's last returned ``commit()`` (or the acknowledged end,
   if that is lower: a commit of records that were never acknowledged may be taken back);
4. every snapshot whose ``snapshot()`` returned opens and holds its records;
5. (writable) a new append gets offset == end offset and reads back;
6. (the first read-only view) a subscriber polling from the log start sees what
   ``read()`` sees.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import compactlog
from compactlog.errors import LogCheckError
from compactlog.storage import filenames
from compactlog.storage.state_files import read_cleaner_state

from .models import CrashState
from .workloads import LOG, PROBE, SCRATCH, Promise, Workload, rebooted

Read = list[tuple[int, bytes, bytes | None]]
BYTES_LITERAL = re.compile(r"b'(?:[^'\\]|\\.)*'" + r'|b"(?:[^"\\]|\\.)*"')  # a repr of bytes


@dataclass(frozen=True, slots=True)
class Failure:
    phase: str  # "read-only", "writable", "snapshot snap", ...
    kind: str  # what failed, with numbers and paths taken out: failures group by it
    detail: str  # the full message

    def __str__(self) -> str:
        return f"{self.phase}: {self.detail}"


class CheckFailed(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


def check_state(state: CrashState, promise: Promise, workload: Workload) -> list[Failure]:
    """Every failure of ``state`` given what was promised when power was lost: read-only
    views before any writable open, with the boot id unchanged (the data was lost under a
    running machine: a FUSE daemon that died, an NFS server that restarted) and changed (a
    power loss is a reboot); then a writable open, and a read-only view after it."""
    failures: list[Failure] = []
    with _copy(state) as root:
        before = _tree(root)
        failures += _run(
            "read-only, same boot",
            root,
            lambda found: _check_read_only(root, promise, workload, found, views=True),
        )
        with rebooted():  # the power loss: heads stored before it are stale
            failures += _check_rebooted(root, promise, workload)
        if _tree(root) != before:
            failures.append(Failure("read-only", "a read-only view changed files", "changed"))
    with rebooted(), _copy(state) as root:
        recovered: list[Read] = []
        failures += _run(
            "writable",
            root,
            lambda found: _check_writable(root, promise, workload, found, recovered),
        )
        if recovered:
            failures += _run(
                "read-only after recovery",
                root,
                lambda found: _check_after_recovery(root, recovered[0], found),
            )
    return failures


def _check_after_recovery(root: str, recovered: Read, found: list[CheckFailed]) -> None:
    """A read-only view after the writable open closed reads what that open had (the
    records it recovered and the probe it appended)."""
    with compactlog.open(os.path.join(root, LOG), read_only=True, create=False) as log:
        got = [(r.offset, r.key, r.value) for r in log.read()]
        if got != recovered:
            raise CheckFailed(
                "a read-only view after recovery differs from the writable open",
                f"it reads offsets {_offsets(got)}, the writable open {_offsets(recovered)}",
            )


def _tree(root: str) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes."""
    files = {}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                files[path] = handle.read()
    return files


def _check_rebooted(root: str, promise: Promise, workload: Workload) -> list[Failure]:
    """The read-only view and every returned snapshot, after a reboot."""
    failures = _run(
        "read-only", root, lambda found: _check_read_only(root, promise, workload, found)
    )
    for path, start, end in promise.snapshots:
        failures += _run(
            f"snapshot {path}",
            root,
            lambda found, p=path, s=start, e=end: _check_snapshot(
                os.path.join(root, p), promise, s, e
            ),
        )
    return failures


@contextmanager
def _copy(state: CrashState) -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="powerloss-state-", dir=SCRATCH)
    try:
        state.materialize(root)
        yield root
    finally:
        _close_leaked(root)
        shutil.rmtree(root, ignore_errors=True)


def _close_leaked(root: str) -> None:
    """Close descriptors still open on files under ``root`` once its checks are over: an
    open that fails may leave some behind (a failed ``SegmentReader`` or writer open), and
    they would pile up over thousands of states and show in other tests' descriptor
    checks. Nothing may use them any more: the log objects of the check are gone."""
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return  # (no /proc: nothing to look at)
    for name in descriptors:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(root + os.sep):
            os.close(int(name))


def _run(phase: str, root: str, check: Callable[[list[CheckFailed]], None]) -> list[Failure]:
    """Run ``check``, which appends what it finds and goes on; an exception stops it."""
    found: list[CheckFailed] = []
    try:
        check(found)
    except CheckFailed as failed:
        found.append(failed)
    except Exception as error:
        message = f"{type(error).__name__}: {error}".replace(root, "<root>")
        return [Failure(phase, normalise(message), message)]
    return [Failure(phase, f.kind, str(f).replace(root, "<root>")) for f in found]


def normalise(message: str) -> str:
    """``message`` with numbers and file names taken out, so alike failures group."""
    message = re.sub(r"<root>\S*", "<path>", message)
    message = BYTES_LITERAL.sub("b'...'", message)
    message = re.sub(r"\b\d{20}\.\w+", "<file>", message)
    return re.sub(r"\d+", "N", message)


def _no_log_yet(root: str, promise: Promise, workload: Workload) -> bool:
    """A brand-new log's state from before its meta file was durable, with nothing
    acknowledged: no log at all is a correct outcome there."""
    meta = os.path.join(root, LOG, filenames.META)
    return workload.create and promise.acked == 0 and not os.path.exists(meta)


def _check_read_only(
    root: str,
    promise: Promise,
    workload: Workload,
    found: list[CheckFailed],
    *,
    views: bool = False,
) -> None:
    if _no_log_yet(root, promise, workload):
        return
    with compactlog.open(os.path.join(root, LOG), read_only=True, create=False) as log:
        got = _check_log(log, promise, workload, found)
        if views:
            _check_views(log, got, found)


def _check_writable(
    root: str,
    promise: Promise,
    workload: Workload,
    found: list[CheckFailed],
    recovered: list[Read] | None = None,
) -> None:
    """The writable open's checks; into ``recovered``, what it reads once they pass (the
    records recovered and the probe appended)."""
    create = _no_log_yet(root, promise, workload)
    with compactlog.open(os.path.join(root, LOG), create=create) as log:
        _check_log(log, promise, workload, found)
        end = log.end_offset
        offset = log.append(*PROBE)
        if offset != end:
            raise CheckFailed(
                "a new append did not get the end offset",
                f"a new append got offset {offset}, the end offset was {end}",
            )
        log.flush()
        back = [(r.offset, r.key, r.value) for r in log.read(start=end)]
        if back != [(end, *PROBE)]:
            raise CheckFailed(
                "a new append does not read back",
                f"after appending at {end}, reading from it gave {back[:3]}",
            )
        try:
            log.check()  # (compactlog.engine.invariants: segments, index, head, checkpoints)
        except LogCheckError as error:
            lines = "; ".join(p.line() for p in error.problems)
            raise CheckFailed("an invariant does not hold after recovery", lines) from None
        if recovered is not None:
            recovered.append([(r.offset, r.key, r.value) for r in log.read()])


def _check_log(
    log: compactlog.Log, promise: Promise, workload: Workload, found: list[CheckFailed]
) -> Read:
    """Records (by the workload's rule), end offset, subscriber checkpoints: every problem
    into ``found``; returns the records read."""
    got = [(r.offset, r.key, r.value) for r in log.read()]
    end = log.end_offset
    rule = RULES[workload.rule]
    if workload.rule == "expiry":
        horizon = read_cleaner_state(log.directory).horizon()
        rule = functools.partial(_check_latest, removed_below=horizon)
    try:
        rule(got, promise)
    except CheckFailed as failed:
        found.append(failed)
    else:  # (records lost imply a low end offset: said once)
        if end < acked_end(promise):
            found.append(
                CheckFailed(
                    "end offset below the acknowledged records",
                    f"end offset {end}, {promise.acked} records acknowledged from "
                    f"{promise.first_offset}",
                )
            )
    durable = log.subscribers()
    for name, offset in durable.items():
        if offset > end:
            found.append(
                CheckFailed(
                    "subscriber checkpoint past the log end",
                    f"subscriber {name!r} checkpoint {offset} is past the end offset {end}",
                )
            )
    for name, offset in dict(promise.commits).items():  # (the last commit of each)
        # a commit past the acknowledged records may come back to them: those may be lost
        if durable.get(name, -1) < min(offset, acked_end(promise)):
            found.append(
                CheckFailed(
                    "a returned commit was lost",
                    f"subscriber {name!r} committed {offset}, the log has {durable.get(name)}",
                )
            )
    return got


def _check_views(log: compactlog.Log, got: Read, found: list[CheckFailed]) -> None:
    """A reader with a path of its own sees what ``read()`` saw (``got``, which
    ``_check_log`` judged): a subscriber polling from the log start (its own segment
    reader and head; ``read_arrow``, ``latest`` and tables share ``read()``'s)."""
    subscriber = log.subscribe("~views", start=log.start_offset)
    polled: Read = []
    while batch := subscriber.poll(max_records=1000):
        polled += [(r.offset, r.key, r.value) for r in batch]
    subscriber.close()
    if polled != got:
        found.append(
            CheckFailed(
                "a subscriber differs from read()",
                f"a subscriber reads offsets {_offsets(polled)}, read() {_offsets(got)}",
            )
        )


def _check_prefix(got: Read, promise: Promise) -> None:
    """``got`` is ``written[:k]`` with their offsets, k >= acknowledged."""
    _check_run(got, promise, 0)
    if len(got) < promise.acked:
        raise CheckFailed(
            "acknowledged records lost",
            f"read {len(got)} records, {promise.acked} were acknowledged",
        )


def _check_suffix(got: Read, promise: Promise) -> None:
    """``got`` is ``written[s:k]`` with their offsets for some s, k >= acknowledged (or
    nothing at all when retention removed every record)."""
    if not got:
        return
    start = index_of(promise, got[0][0])
    _check_run(got, promise, start)
    if start + len(got) < promise.acked:
        raise CheckFailed(
            "acknowledged records lost",
            f"read offsets {got[0][0]}..{got[-1][0]}, {promise.acked} records acknowledged",
        )


def _check_run(got: Read, promise: Promise, start: int) -> None:
    written = promise.written
    for i, (offset, key, value) in enumerate(got):
        j = start + i
        if offset != offset_of(promise, j):
            raise CheckFailed(
                "records out of order or with a hole",
                f"record {i} read has offset {offset}, expected {offset_of(promise, j)} "
                f"(offsets read: {_offsets(got)})",
            )
        if j >= len(written) or (key, value) != written[j]:
            raise CheckFailed(
                "a record read that was never written (garbage)",
                f"offset {offset} reads {key!r}={value!r:.40}",
            )


def _check_latest(got: Read, promise: Promise, removed_below: int | None = None) -> None:
    """After compaction: records written, in increasing offsets, with every key's latest
    acknowledged record (a tombstone may be gone if it is below ``removed_below``, the log's
    tombstone horizon: the cleaner said it may have removed it)."""
    written = promise.written
    previous = -1
    for offset, key, value in got:
        j = index_of(promise, offset)
        if offset <= previous:
            raise CheckFailed("records out of order", f"offset {offset} read after {previous}")
        if not 0 <= j < len(written) or (key, value) != written[j]:
            raise CheckFailed(
                "a record read that was never written (garbage)",
                f"offset {offset} reads {key!r}={value!r:.40}",
            )
        previous = offset
    latest = {
        key: offset_of(promise, j) for j, (key, _value) in enumerate(written[: promise.acked])
    }
    present = {offset for offset, _key, _value in got}
    missing = sorted(offset for offset in latest.values() if offset not in present)
    if removed_below is not None:
        gone = [o for o in missing if written[index_of(promise, o)][1] is None]
        above = [o for o in gone if o >= removed_below]
        if above:
            raise CheckFailed(
                "a removed tombstone above the tombstone horizon",
                f"tombstones at {above[:8]} are gone, the horizon is {removed_below}",
            )
        missing = [o for o in missing if o not in gone]
    if missing:
        raise CheckFailed(
            "a key's latest acknowledged record lost",
            f"latest records of {len(missing)} keys missing, offsets {missing[:8]}",
        )


def offset_of(promise: Promise, j: int) -> int:
    """The offset of ``written[j]`` (for ``j == len(written)``, the one after the last)."""
    if not promise.offsets:
        return promise.first_offset + j
    if j < len(promise.offsets):
        return promise.offsets[j]
    return (promise.offsets[-1] + 1 + j - len(promise.offsets)) if promise.offsets else j


def acked_end(promise: Promise) -> int:
    """The offset just past the last acknowledged record."""
    if not promise.acked:
        return promise.first_offset
    return offset_of(promise, promise.acked - 1) + 1


def index_of(promise: Promise, offset: int) -> int:
    """The index into ``written`` of the record at ``offset`` (-1 if none was written there)."""
    if not promise.offsets:
        return offset - promise.first_offset
    for j, at in enumerate(promise.offsets):
        if at >= offset:
            return j if at == offset else -1
    return len(promise.offsets) + offset - promise.offsets[-1] - 1


def _check_snapshot(path: str, promise: Promise, start: int, end: int) -> None:
    with compactlog.open(path, read_only=True, create=False) as log:
        got = [(r.offset, r.key, r.value) for r in log.read()]
    want = [
        (offset_of(promise, j), *promise.written[j])
        for j in range(index_of(promise, start), index_of(promise, end))
    ]
    if got != want:
        raise CheckFailed(
            "a returned snapshot does not hold its records",
            f"snapshot of [{start}, {end}) reads offsets {_offsets(got)}",
        )


def _offsets(got: Read) -> str:
    offsets = [offset for offset, _key, _value in got]
    return str(offsets) if len(offsets) <= 12 else f"{offsets[:6]} ... {offsets[-6:]}"


RULES: dict[str, Callable[[Read, Promise], None]] = {
    "prefix": _check_prefix,
    "suffix": _check_suffix,
    "latest": _check_latest,
    "expiry": _check_latest,  # (with the log's tombstone horizon: see _check_log)
}

"""Workloads run under the recorder, each saying what it had acknowledged at every event.

A workload is a function of a :class:`Session`. It sets its log up first (that part is not
recorded and is durable, as after ``sync``), declares every record it will ever append
(:meth:`Session.expect`, in offset order), then runs the part under test inside
``session.recording()`` and calls :meth:`Session.ack` and friends the moment a promise
is made:

- a record is acknowledged under ``sync="always"`` when ``append``/``append_batch``
  returns, under ``"interval"`` and ``"os"`` when ``flush()`` returns;
- a subscriber's commit when ``commit()`` returns;
- a snapshot when ``snapshot()`` returns.

Records are small and workloads short (KiBs, a few dozen events): the suite checks every
crash point of every workload under every model, so size is what its budget buys.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import compactlog
from compactlog.storage.head import BOOT

from .models import MODELS, CrashState, ordered_with_new
from .recorder import SYNC_CALLS, Recorder, Recording

LOG = "log"  # the log's directory, relative to the workload's root
SNAPSHOT = "snap"  # a snapshot's destination, relative to the root
PROBE = (b"probe", b"written after the power loss")

Record = tuple[bytes, bytes | None]


def _scratch() -> str | None:
    """Where workloads and checks make their directories: a memory file system when there
    is one (nothing here needs a real disk, and a real fsync per call would be most of the
    suite's time), else the default temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


SCRATCH = _scratch()


@dataclass(frozen=True, slots=True)
class Promise:
    """What a workload has promised so far (an immutable value: events keep the one that
    held when they ran)."""

    written: tuple[Record, ...] = ()  # every record the workload appends, in offset order
    first_offset: int = 0  # the offset of written[0]
    acked: int = 0  # written[:acked] are acknowledged
    # the offset of each of written, when they are not first_offset + index: after a power
    # loss recovery starts new offsets past those lost records had (a gap)
    offsets: tuple[int, ...] = ()
    commits: tuple[tuple[str, int], ...] = ()  # (subscriber, offset) of returned commits
    snapshots: tuple[tuple[str, int, int], ...] = ()  # (path, start, end) of returned ones


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    run: Callable[[Session], None]
    rule: str = "prefix"  # "prefix": read = written[:k]; "suffix": retention may drop a
    # prefix; "latest": compaction keeps at least every key's latest record; "expiry":
    # "latest", but a latest tombstone may be gone if it is below the tombstone horizon
    create: bool = False  # a brand-new log: a state without its meta file is no log yet


class Session:
    """A workload's root directory, its recorder and its promises."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.log = os.path.join(self.root, LOG)
        self.recorder = Recorder(self.root)
        self.promise = Promise()

    @contextmanager
    def recording(self) -> Iterator[None]:
        self.recorder.progress = self.promise
        with self.recorder.recording():
            yield

    def _promise(self, **changes: Any) -> None:
        self.promise = dataclasses.replace(self.promise, **changes)
        self.recorder.progress = self.promise

    def expect(
        self, records: list[Record], first_offset: int = 0, offsets: tuple[int, ...] = ()
    ) -> None:
        self._promise(written=tuple(records), first_offset=first_offset, offsets=offsets)

    def ack(self, count: int) -> None:
        """``written[:count]`` are acknowledged."""
        self._promise(acked=max(self.promise.acked, count))

    def commit(self, name: str, offset: int) -> None:
        self._promise(commits=(*self.promise.commits, (name, offset)))

    def snapshot(self, path: str, start: int, end: int) -> None:
        self._promise(snapshots=(*self.promise.snapshots, (path, start, end)))


def record(workload: Workload) -> Recording:
    """Run ``workload`` in a fresh directory and return its events."""
    root = tempfile.mkdtemp(prefix=f"powerloss-{workload.name}-", dir=SCRATCH)
    try:
        session = Session(root)
        workload.run(session)
        return session.recorder.result()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def records(count: int, *, keys: int | None = None, size: int = 40) -> list[Record]:
    """``count`` records; keys cycle through ``keys`` distinct ones (all distinct if None)."""
    made = []
    for i in range(count):
        key = f"k{i % keys if keys else i:04d}".encode()
        made.append((key, f"v{i:04d}-".encode().ljust(size, b"x")))
    return made


def _create(session: Session, written: list[Record], count: int, **config: Any) -> None:
    """The unrecorded setup: a log with ``config`` holding ``written[:count]``, closed."""
    with compactlog.open(session.log, **config) as log:
        if count:
            log.append_batch(written[:count])
        log.flush()
    session.ack(count)


# -- appends ---------------------------------------------------------------------------------
def appending(
    sync: str,
    *,
    batch: int = 1,
    count: int = 9,
    exclusive: bool = False,
    flush_every: int = 3,
    **config: Any,
) -> Callable[[Session], None]:
    """Append ``count`` records (``batch`` per ``append_batch`` call, or single appends) to
    a log with two records, acknowledging as the sync policy promises."""

    def run(session: Session) -> None:
        settings = dict(config)
        written = records(count + 2, size=settings.pop("value_size", 40))
        session.expect(written)
        _create(session, written, 2, sync=sync, sync_interval_ms=60_000, **settings)
        with session.recording(), compactlog.open(session.log, exclusive=exclusive) as log:
            _append(session, log, written, 2, sync, batch, flush_every)

    return run


def _append(
    session: Session,
    log: compactlog.Log,
    written: list[Record],
    done: int,
    sync: str,
    batch: int,
    flush_every: int,
) -> None:
    """Append ``written[done:]``, acknowledging per policy, and flush at the end."""
    calls = 0
    while done < len(written):
        chunk = written[done : done + batch]
        if batch == 1:
            log.append(*chunk[0])
        else:
            log.append_batch(chunk)
        done += len(chunk)
        calls += 1
        if sync == "always":
            session.ack(done)
        elif calls % flush_every == 0:
            log.flush()
            session.ack(done)
    log.flush()
    session.ack(done)


def new_log(session: Session) -> None:
    """A log created by the recorded ``open`` (its directory too), then appends."""
    written = records(5)
    session.expect(written)
    with session.recording(), compactlog.open(session.log, sync="always") as log:
        _append(session, log, written, 0, "always", 1, 1)


def new_log_in_directory(session: Session) -> None:
    """A log created by the recorded ``open`` in an empty directory that is durable."""
    written = records(5)
    session.expect(written)
    os.makedirs(session.log)
    with session.recording(), compactlog.open(session.log, sync="always") as log:
        _append(session, log, written, 0, "always", 1, 1)


def rolls(exclusive: bool) -> Callable[[Session], None]:
    return appending("always", count=14, exclusive=exclusive, segment_bytes=1024, value_size=150)


def buffered(**config: Any) -> Callable[[Session], None]:
    """Appends through a precommit or linger buffer, acknowledged at ``flush()``."""
    return appending("interval", count=8, **config)


# -- compaction, retention, snapshots, repair, subscribers -----------------------------------
def compaction(session: Session) -> None:
    """A forced compaction pass over closed segments in which some keys have one record."""
    written = records(24, keys=6, size=60)
    written += records(30, size=60)[24:]  # six keys whose only record must survive
    session.expect(written)
    _create(session, written, len(written), segment_bytes=1024, sync="always")
    with session.recording(), compactlog.open(session.log) as log:
        log.compact(force=True)


def compaction_spilled(session: Session) -> None:
    """A forced pass over more keys than its map has room for (``cleaner_buffer_bytes=4096``:
    170), so the keys go through spill files
    (``compaction/latest.py``): their creation, writes and removal are crash points too, and
    a spill file a crash leaves behind must never change what the log holds."""
    written = records(260, keys=200, size=40)  # 200 keys; 140 have one record only
    session.expect(written)
    _create(
        session, written, len(written), segment_bytes=4096, cleaner_buffer_bytes=4096, sync="always"
    )
    with session.recording(), compactlog.open(session.log) as log:
        log.compact(force=True)


def tombstone_expiry(session: Session) -> None:
    """A forced pass that removes expired tombstones (``delete_retention_ms=0``; an earlier
    pass, in the setup, passed them): what it removes must stay below the tombstone
    horizon stored in ``cleaner.checkpoint`` at every crash point (the cleaner's step 4a)."""
    written = records(18, keys=6, size=60)
    written += [(b"k0001", None), (b"k0004", None)]
    written += records(36, size=60)[20:]  # other keys: the deletes end in closed segments
    session.expect(written)
    _create(
        session, written, len(written), segment_bytes=1024, sync="always", delete_retention_ms=0
    )
    with compactlog.open(session.log) as log:
        log.compact(force=True)  # (passes the tombstones)
    with session.recording(), compactlog.open(session.log) as log:
        log.compact(force=True)


def retention(session: Session) -> None:
    """Retention by size deletes the oldest segments, then appends go on."""
    written = records(24, size=80)
    session.expect(written)
    _create(
        session,
        written,
        20,
        segment_bytes=1024,
        cleanup_policy="delete",
        retention_bytes=2048,
        sync="always",
    )
    with session.recording(), compactlog.open(session.log) as log:
        log.enforce_retention()
        _append(session, log, written, 20, "always", 1, 1)


def snapshot(session: Session) -> None:
    """A snapshot of a log with closed and active segments, then appends."""
    written = records(16, size=80)
    session.expect(written)
    _create(session, written, 12, segment_bytes=1024, sync="always")
    with session.recording(), compactlog.open(session.log) as log:
        taken = log.snapshot(os.path.join(session.root, SNAPSHOT))
        session.snapshot(SNAPSHOT, taken.start_offset, taken.end_offset)
        _append(session, log, written, 12, "always", 1, 1)


def repair(session: Session) -> None:
    """``compactlog.repair`` of a log whose newest segment ends in a torn batch, then
    appends."""
    written = records(8)
    session.expect(written)
    _create(session, written, 5, sync="always")
    newest = max(name for name in os.listdir(session.log) if name.endswith(".log"))
    with open(os.path.join(session.log, newest), "ab") as handle:
        handle.write(b"\x40\x00\x00\x00torn batch")
        os.fsync(handle.fileno())
    with session.recording():
        compactlog.repair(session.log)
        with compactlog.open(session.log) as log:
            _append(session, log, written, 5, "always", 1, 1)


def subscriber(session: Session) -> None:
    """A durable subscriber polls and commits while records are appended."""
    written = records(9)
    session.expect(written)
    _create(session, written, 4, sync="always")
    with session.recording(), compactlog.open(session.log) as log:
        sub = log.subscribe("s")
        for done in (6, 9):
            sub.poll(max_records=100)
            sub.commit()
            session.commit("s", sub.committed)
            _append(session, log, written[:done], session.promise.acked, "always", 1, 1)
        sub.poll(max_records=100)
        sub.commit()
        session.commit("s", sub.committed)
        sub.close()


def subscriber_before_sync(session: Session) -> None:
    """``sync="always"``: a subscriber polls and commits between an append's publish and
    its fsync (the recorder runs it right before the segment's sync)."""
    written = records(5)
    session.expect(written)
    _create(session, written, 2, sync="always")
    with session.recording(), compactlog.open(session.log) as log:
        sub = log.subscribe("s")

        def poll_and_commit() -> None:
            sub.poll(max_records=100)
            sub.commit()
            session.commit("s", sub.committed)

        poll_and_commit()
        for done in range(3, 6):
            session.recorder.once_before("fdatasync", f"{LOG}/", poll_and_commit)
            log.append(*written[done - 1])
            session.ack(done)
        sub.close()


def subscriber_unflushed(session: Session) -> None:
    """``sync="interval"``: a subscriber commits records not yet flushed (allowed to be
    lost by a power loss; its checkpoint must then not stay past the log's end)."""
    written = records(6)
    session.expect(written)
    _create(session, written, 2, sync="interval", sync_interval_ms=60_000)
    with session.recording(), compactlog.open(session.log) as log:
        sub = log.subscribe("s")
        for chunk in (written[2:4], written[4:6]):
            log.append_batch(chunk)
            sub.poll(max_records=100)
            sub.commit()
            session.commit("s", sub.committed)
            log.flush()
            session.ack(session.promise.acked + len(chunk))
        sub.close()


def two_losses(session: Session) -> None:
    """A second power loss: crash state A of a recorded ``sync="always"`` run (the ordered
    model's state at its last segment sync whose unsynced data, ``.lock`` among it, kept its
    old content), opened writable, appended to and closed under the recorder."""
    recording = record(Workload("first", appending("always", count=4)))
    state, promise = _crash_state_a(recording)
    _second_run(session, state, promise, size=40)


def two_losses_stale_head(session: Session) -> None:
    """A second power loss after a first one that kept the head in ``.lock`` but not the
    records it describes (``sync="interval"``, before the flush; an ordered-model state),
    so the old head points into the records the second run appends (larger ones)."""
    _two_losses_from_unflushed(session, f"{LOG}/.lock")


def two_losses_stale_index(session: Session) -> None:
    """The same with the segment's index instead of the head, in a log created by the
    first run (so ``.lock`` never reached disk and recovery starts from the index): after
    the first loss the index's entries point past the records that survived, into what the
    second run appends."""
    recording = record(Workload("first", _fresh_unflushed))
    index = max(e.index for e in recording.events if e.call == "pwrite" and ".log" in e.detail)
    state = ordered_with_new(recording, index, {f"{LOG}/00000000000000000000.idx"})
    _second_run(session, state, recording.progress_at_crash(index), size=90)


def _fresh_unflushed(session: Session) -> None:
    """A log created recorded (``sync="interval"``, an index entry every 100 bytes), two
    records flushed, then three more flushed at the close."""
    written = records(5)
    session.expect(written)
    with (
        session.recording(),
        compactlog.open(
            session.log, sync="interval", sync_interval_ms=60_000, index_interval_bytes=100
        ) as log,
    ):
        _append(session, log, written[:2], 0, "interval", 1, 100)
        _append(session, log, written, 2, "interval", 1, 100)


def _two_losses_from_unflushed(session: Session, kept: str) -> None:
    first = Workload(
        "first", appending("interval", count=5, flush_every=100, index_interval_bytes=100)
    )
    recording = record(first)
    index = max(e.index for e in recording.events if e.call == "pwrite" and ".log" in e.detail)
    state = ordered_with_new(recording, index, {kept})
    _second_run(session, state, recording.progress_at_crash(index), size=90)


def _second_run(session: Session, state: CrashState, promise: Promise, *, size: int) -> None:
    """Materialize crash state A, then open it writable, append three records of ``size``
    bytes under ``sync="always"`` and close, recorded."""
    state.materialize(session.root)
    with rebooted():  # the power loss
        kept, end = _after_open(state)  # the records recovered, and where new ones go
        written = list(promise.written[:kept]) + records(kept + 3, size=size)[kept:]
        # (offsets lost records had are skipped: recovery starts new ones at ``end``)
        offsets = (*range(kept), *range(end, end + 3))
        session.expect(written, offsets=offsets)
        session.ack(promise.acked)
        with session.recording(), compactlog.open(session.log, sync="always") as log:
            _append(session, log, written, kept, "always", 1, 1)


@contextmanager
def rebooted() -> Iterator[None]:
    """A power loss is a reboot: a boot id of its own while inside, so that heads stored
    before it are stale (``compactlog.storage.head.BOOT``); this process's own boot id after."""
    before = BOOT.id
    BOOT.id = os.urandom(16)
    try:
        yield
    finally:
        BOOT.id = before


def _after_open(state: CrashState) -> tuple[int, int]:
    """How many records a writable open of ``state`` recovers, and its end offset (on a
    copy)."""
    root = tempfile.mkdtemp(prefix="powerloss-a-", dir=SCRATCH)
    try:
        state.materialize(root)
        with compactlog.open(os.path.join(root, LOG), create=False) as log:
            return sum(1 for _ in log.read()), log.end_offset
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _crash_state_a(recording: Recording) -> tuple[CrashState, Promise]:
    states = list(MODELS["ordered"](recording, 0))
    for event in reversed(recording.events):
        if event.call in SYNC_CALLS and event.detail.endswith(".log"):
            for state in states[event.index]:
                if state.variant.endswith("data at last sync"):
                    return state, recording.progress_at_crash(event.index)
    raise AssertionError("the first run made no segment sync")


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("single-always", appending("always")),
        Workload("single-interval", appending("interval")),
        Workload("single-os", appending("os")),
        Workload("batch-always", appending("always", batch=3)),
        Workload("batch-interval", appending("interval", batch=3)),
        Workload("batch-os", appending("os", batch=3)),
        Workload("exclusive-always", appending("always", exclusive=True)),
        Workload("exclusive-interval", appending("interval", exclusive=True)),
        Workload("rolls", rolls(False)),
        Workload("rolls-exclusive", rolls(True)),
        Workload("new-log", new_log, create=True),
        Workload("new-log-in-directory", new_log_in_directory, create=True),
        Workload("precommit", buffered(precommit_bytes=4096)),
        Workload("linger", buffered(linger_ms=10_000)),
        Workload("compaction", compaction, rule="latest"),
        Workload("compaction-spilled", compaction_spilled, rule="latest"),
        Workload("tombstone-expiry", tombstone_expiry, rule="expiry"),
        Workload("retention", retention, rule="suffix"),
        Workload("snapshot", snapshot),
        Workload("repair", repair),
        Workload("subscriber", subscriber),
        Workload("subscriber-before-sync", subscriber_before_sync),
        Workload("subscriber-unflushed", subscriber_unflushed),
        Workload("two-losses", two_losses),
        Workload("two-losses-stale-head", two_losses_stale_head),
        Workload("two-losses-stale-index", two_losses_stale_index),
    ]
}

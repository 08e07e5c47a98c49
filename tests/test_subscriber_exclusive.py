"""One consumer per durable subscriber name, and subscribers closed with their log.

A durable name is held by an ``flock`` on its lock file while a :class:`Subscriber` is open:
another ``subscribe(name)`` in any thread or process gets :class:`SubscriberBusyError`
naming the holder's pid; the lock dies with the holder, even a ``kill -9``-ed one.
:meth:`Log.close` closes every subscriber the log made: their descriptors go and using one
raises :class:`LogClosedError`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import compactlog
from compactlog import LogClosedError, SubscriberBusyError, SubscriberError
from compactlog.engine.subscriber import name_holder, set_committed
from compactlog.engine.subscriber_names import _holder_of
from compactlog.storage import filenames, lockfile


def fill(log, count):
    log.append_batch([(b"k%d" % i, b"v%d" % i) for i in range(count)])


def fds_into(directory) -> list[str]:
    """This process's descriptors on files inside ``directory``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            found.append(target)
    return found


# -- in one process ------------------------------------------------------------------------


def test_a_second_subscriber_of_a_durable_name_is_refused_naming_the_holder(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 10)
        first = log.subscribe("billing")
        with pytest.raises(SubscriberBusyError) as caught:
            log.subscribe("billing")
        error = caught.value
        assert error.subscriber == "billing" and error.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(error) and "'billing'" in str(error)
        assert isinstance(error, compactlog.CompactLogError)
        first.poll(max_records=4)
        first.commit()
        first.close()
        second = log.subscribe("billing")  # free as soon as the first is closed
        assert second.position == 4
        assert log.subscribe("other").position == 0  # other names are independent


def test_exclusivity_holds_between_threads_and_between_log_objects(log_dir):
    with compactlog.open(log_dir) as log, compactlog.open(log_dir, read_only=True) as reader:
        fill(log, 10)
        held = log.subscribe("s")
        errors: list[BaseException] = []

        def contend() -> None:
            try:
                reader.subscribe("s")
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=contend)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], SubscriberBusyError)
        held.close()
        assert reader.subscribe("s").position == 0


def test_transient_subscribers_are_never_exclusive(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 5)
        one, two = log.subscribe("~live"), log.subscribe("~live")
        fill(log, 2)
        assert len(one.poll()) == len(two.poll()) == 2
        assert not [n for n in os.listdir(log_dir) if n.endswith(".lock") and "~" in n]


def test_a_name_is_free_again_when_a_forgotten_subscriber_is_garbage_collected(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 3)
        log.subscribe("s")  # dropped at once
        import gc

        gc.collect()
        assert log.subscribe("s").position == 0


def test_the_lock_file_is_hidden_never_a_checkpoint_and_removed_with_the_subscriber(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 3)
        log.subscribe("s").close()
        lock_name = filenames.subscriber_lock_name("s")
        assert lock_name == ".cp.73.lock" and (log_dir / lock_name).exists()
        assert filenames.parse_filename(lock_name).kind is filenames.FileKind.LOCK
        assert log.subscribers() == {"s": 0}
        log.remove_subscriber("s")
        assert not (log_dir / lock_name).exists() and log.subscribers() == {}
        assert log.subscribe("s").position == 0  # a new one takes a fresh lock file


def test_remove_and_seek_refuse_a_subscriber_in_use_unless_forced(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 10)
        consumer = log.subscribe("s")
        with pytest.raises(SubscriberBusyError, match=f"pid {os.getpid()}"):
            log.remove_subscriber("s")
        with pytest.raises(SubscriberBusyError):
            set_committed(log, "s", 7)
        assert log.subscribers() == {"s": 0}
        for bad in (-1, 11, "3"):
            with pytest.raises(SubscriberError):
                set_committed(log, "s", bad, force=True)
        assert set_committed(log, "s", 7, force=True) == 7
        assert log.subscribers() == {"s": 7}
        log.remove_subscriber("s", force=True)
        assert log.subscribers() == {}
        consumer.close()
        with pytest.raises(SubscriberError, match="no durable subscriber"):
            set_committed(log, "s", 1)
        log.subscribe("t").close()
        assert set_committed(log, "t", 6) == 6 and log.subscribers() == {"t": 6}


def test_name_holder_reports_who_consumes_without_taking_the_name(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 3)
        assert name_holder(str(log_dir), "s") is None
        sub = log.subscribe("s")
        assert name_holder(str(log_dir), "s") == os.getpid()
        sub.close()
        assert name_holder(str(log_dir), "s") is None


# -- Log.close closes the subscribers it made ------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_closing_the_log_closes_its_subscribers_and_their_descriptors(log_dir, read_only):
    with compactlog.open(log_dir) as log:
        fill(log, 20)
    log = compactlog.open(log_dir, read_only=read_only)
    durable, transient = log.subscribe("s"), log.subscribe("~t", start=0)
    assert len(durable.poll(max_records=5)) == len(transient.poll(max_records=5)) == 5
    assert fds_into(log_dir)  # segment, head and lock descriptors are open
    log.close()
    assert fds_into(log_dir) == []
    assert durable.closed and transient.closed
    for sub in (durable, transient):
        with pytest.raises(LogClosedError):
            sub.poll()
        with pytest.raises(LogClosedError):
            sub.commit()
        with pytest.raises(LogClosedError):
            sub.seek(0)
    with compactlog.open(log_dir) as again:
        assert again.subscribe("s").position == 0  # the name went with the close


def test_closing_the_log_wakes_a_poll_waiting_in_another_thread(log_dir):
    log = compactlog.open(log_dir)
    fill(log, 3)
    sub = log.subscribe("s")
    sub.poll()
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(sub.poll(timeout_s=30))
        except LogClosedError as error:
            outcome.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.1)
    log.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], LogClosedError)


# -- across processes ------------------------------------------------------------------------

CONTENDER = textwrap.dedent(
    """
    import json, os, sys, time
    import compactlog
    path, name, role = sys.argv[1], sys.argv[2], sys.argv[3]
    log = compactlog.open(path, read_only=True)
    if role == "holder":
        sub = log.subscribe(name)
        sub.poll(max_records=6)
        sub.commit()
        print(json.dumps({"pid": os.getpid(), "position": sub.position}), flush=True)
        time.sleep(600)
    for line in sys.stdin:  # "try": attempt to take the name, say what happened
        started = time.monotonic()
        try:
            sub = log.subscribe(name)
        except compactlog.SubscriberBusyError as error:
            print(json.dumps({"busy": error.pid, "message": str(error)}), flush=True)
        else:
            print(json.dumps({"position": sub.position,
                              "waited_s": time.monotonic() - started}), flush=True)
    """
)


def test_two_processes_one_name_and_the_holder_killed_hard(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 20)
    holder = subprocess.Popen(
        [sys.executable, "-c", CONTENDER, str(log_dir), "billing", "holder"],
        stdout=subprocess.PIPE,
        text=True,
    )
    other = subprocess.Popen(
        [sys.executable, "-c", CONTENDER, str(log_dir), "billing", "other"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and other.stdin is not None and other.stdout is not None
        held = json.loads(holder.stdout.readline())
        assert held == {"pid": holder.pid, "position": 6}

        def attempt() -> dict:
            other.stdin.write("try\n")
            other.stdin.flush()
            return json.loads(other.stdout.readline())

        refused = attempt()
        assert refused["busy"] == holder.pid and f"pid {holder.pid}" in refused["message"]
        assert name_holder(str(log_dir), "billing") == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        taken = attempt()  # at once: the kernel dropped the dead holder's lock
        assert taken["position"] == 6  # resumes at the killed consumer's commit
    finally:
        for child in (holder, other):
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)


def test_an_empty_stamp_of_a_holder_is_read_again_by_a_subscriber(tmp_path):
    """A holder writes its stamp a moment after its flock: a refused subscriber looks at
    the file again rather than naming no pid."""
    path = str(tmp_path / "x.lock")
    fd = lockfile.lock(path)
    try:
        assert _holder_of(path, "") == os.getpid()
        assert _holder_of(path, "pid 12 exclusive") == 12
    finally:
        lockfile.release(fd, clear=True)
    assert _holder_of(path, "") is None

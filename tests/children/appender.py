"""Child process of the crash and concurrency tests: appends in a loop, acknowledging.

Usage: python appender.py LOG_DIR WRITER_ID COUNT MODE [CONFIG_JSON]

Each record's key is ``w<writer>-<seq>`` and its value is derived from the key
(``tests.helpers.value_for``), so a reader can check every record from its bytes alone.
After each ``append``/``append_batch`` returns, one line ``<first offset> <seq> <n>`` is
written to stdout (one ``write``: a pipe keeps it whole) — the acknowledgement. ``COUNT`` of
0 appends until killed. MODE ``mixed`` mixes single appends and batches; ``single`` and
``batch`` use only one of them; ``threads`` runs three threads of single appends (writer ids
``WRITER_ID * 10 + thread``); ``linger`` makes single appends with ``linger_ms`` set and
acknowledges records only once a ``flush()`` returned (lingering records are not promised).
CONFIG_JSON's ``exclusive`` is passed to ``open`` (it is not a stored setting).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import compactlog
from tests.helpers import value_for


def main() -> None:
    directory, writer, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    config = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    rng = random.Random(writer * 7919 + os.getpid())
    out = sys.stdout.buffer
    exclusive = bool(config.pop("exclusive", False))
    log = compactlog.open(directory, exclusive=exclusive, **config)
    out.write(b"ready\n")
    out.flush()
    if mode == "threads":
        return threaded(log, writer, count, out)
    if mode == "linger":
        return lingering(log, writer, count, out, rng)
    seq = 0
    while count == 0 or seq < count:
        single = mode == "single" or (mode == "mixed" and rng.random() < 0.6)
        n = 1 if single else rng.randint(2, 20)
        if count:
            n = min(n, count - seq)
        keys = [b"w%d-%d" % (writer, seq + i) for i in range(n)]
        sizes = [rng.choice((0, 8, 40, 300)) for _ in range(n)]
        if single:
            first = log.append(keys[0], value_for(keys[0], sizes[0]))
        else:
            first = log.append_batch(
                [(k, value_for(k, s)) for k, s in zip(keys, sizes, strict=True)]
            ).start
        out.write(b"%d %d %d\n" % (first, seq, n))
        out.flush()
        seq += n
    log.close()
    out.write(b"done\n")
    out.flush()


def threaded(log, writer, count, out) -> None:
    lock = threading.Lock()

    def work(thread: int) -> None:
        me = writer * 10 + thread
        seq = 0
        while count == 0 or seq < count:
            key = b"w%d-%d" % (me, seq)
            first = log.append(key, value_for(key, (0, 8, 40)[seq % 3]))
            with lock:
                out.write(b"%d %d %d %d\n" % (first, seq, 1, me))
                out.flush()
            seq += 1

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    out.write(b"done\n")
    out.flush()


def lingering(log, writer, count, out, rng) -> None:
    seq = 0
    pending: list[tuple[int, int]] = []
    while count == 0 or seq < count:
        key = b"w%d-%d" % (writer, seq)
        pending.append((log.append(key, value_for(key, rng.choice((0, 8, 40)))), seq))
        seq += 1
        if rng.random() < 0.1:
            log.flush()
            out.write(b"".join(b"%d %d 1\n" % acked for acked in pending))
            out.flush()
            pending.clear()
    log.close()
    out.write(b"".join(b"%d %d 1\n" % acked for acked in pending) + b"done\n")
    out.flush()


if __name__ == "__main__":
    main()

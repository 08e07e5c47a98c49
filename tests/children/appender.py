"""Child process of the crash and concurrency tests: appends in a loop, acknowledging.

Usage: python appender.py LOG_DIR WRITER_ID COUNT MODE [CONFIG_JSON]

Each record's key is ``w<writer>-<seq>`` and its value is derived from the key
(``tests.helpers.value_for``), so a reader can check every record from its bytes alone.
After each ``append``/``append_batch`` returns, one line ``<first offset> <seq> <n>`` is
written to stdout (one ``write``: a pipe keeps it whole) — the acknowledgement. ``COUNT`` of
0 appends until killed. MODE ``mixed`` mixes single appends and batches; ``single`` and
``batch`` use only one of them.
"""

from __future__ import annotations

import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import compactlog
from tests.helpers import value_for


def main() -> None:
    directory, writer, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    config = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    rng = random.Random(writer * 7919 + os.getpid())
    out = sys.stdout.buffer
    log = compactlog.open(directory, **config)
    out.write(b"ready\n")
    out.flush()
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


if __name__ == "__main__":
    main()

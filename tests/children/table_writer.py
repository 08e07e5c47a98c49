"""Child process of the table tests: a writer, cleaner and retention run by commands.

Usage: python table_writer.py LOG_DIR CONFIG_JSON

Reads one command per line on stdin and answers one line on stdout once it is done:
``append <key hex> v<value hex>`` (or ``-`` for a tombstone) answers the record's offset;
``compact`` (a forced cleaning pass; with ``delete_retention_ms=0`` it drops tombstones the
cleaner saw before) and ``retain`` (delete
retention as if far in the future: every closed segment goes) answer ``ok``; ``pairs N``
appends ``N`` batches ``[(b"a", i), (b"b", i)]`` as fast as it can and answers the last
offset. End of input closes the log.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import compactlog

FAR_FUTURE_MS = 1 << 50


def main() -> None:
    directory, config = sys.argv[1], json.loads(sys.argv[2])
    out = sys.stdout
    with compactlog.open(directory, **config) as log:
        print("ready", file=out, flush=True)
        for line in sys.stdin:
            words = line.split()
            if words[0] == "append":
                value = None if words[2] == "-" else bytes.fromhex(words[2][1:])
                answer = str(log.append(bytes.fromhex(words[1]), value))
            elif words[0] == "compact":
                log.compact(force=True)
                answer = "ok"
            elif words[0] == "retain":
                log.enforce_retention(now_ms=FAR_FUTURE_MS)
                answer = "ok"
            elif words[0] == "pairs":
                last = -1
                for i in range(int(words[1])):
                    last = log.append_batch([(b"a", b"%d" % i), (b"b", b"%d" % i)]).stop - 1
                answer = str(last)
            else:
                raise SystemExit(f"unknown command {words[0]!r}")
            print(answer, file=out, flush=True)


if __name__ == "__main__":
    main()

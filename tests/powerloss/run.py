"""``python -m tests.powerloss.run [--workload NAME] [--model NAME] [--slow] [--save]``

Checks every crash point of the chosen workloads under the chosen models and prints, per
workload and model, the states checked and the failures grouped by kind, with one example
each (the events up to the crash point and the check that failed). ``--slow`` adds the
slow models (reordered metadata, garbled sectors). ``--save`` writes the first example of
each kind per workload as a regression fixture into tests/powerloss/fixtures/. Exits 1
when anything failed.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import regressions, suite
from .models import MODELS, SLOW_MODELS
from .workloads import WORKLOADS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.powerloss.run", description=__doc__)
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--model", action="append", choices=sorted(suite.ALL_MODELS))
    parser.add_argument("--slow", action="store_true", help="add the slow models")
    parser.add_argument("--save", action="store_true", help="save one fixture per failure kind")
    args = parser.parse_args(argv)
    models = args.model or [*MODELS, *(SLOW_MODELS if args.slow else ())]
    names = args.workload or list(WORKLOADS)
    started = time.perf_counter()
    total_failed = 0
    examples: dict[tuple[str, str], suite.FailedState] = {}  # (workload, kind) -> first
    for name in names:
        recording = suite.recording(name)
        for model in models:
            states = sum(len(s) for s in suite.crash_states(name, model))
            kinds: dict[str, list[suite.FailedState]] = {}
            for event in recording.events:
                for failed in suite.check_point(name, model, event.index):
                    for failure in failed.failures:
                        kinds.setdefault(f"{failure.phase}: {failure.kind}", []).append(failed)
            failed_states = {id(f.state) for found in kinds.values() for f in found}
            total_failed += len(failed_states)
            print(
                f"{name} / {model}: {len(recording.events)} events, {states} states, "
                f"{len(failed_states)} failing"
            )
            for kind, found in sorted(kinds.items(), key=lambda item: -len(item[1])):
                example = found[0]
                print(f"  [{len(found)}] {kind}")
                for line in example.tail(recording):
                    print(f"      {line}")
                print(f"    state: {example.state.variant}")
                for failure in example.failures:
                    print(f"    -> {failure}")
                examples.setdefault((name, kind), example)
    print(f"{total_failed} failing states; {time.perf_counter() - started:.1f} s")
    if args.save:
        saved = {regressions.save(example) for example in examples.values()}
        print(f"saved {len(saved)} fixtures into {regressions.FIXTURES}")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())

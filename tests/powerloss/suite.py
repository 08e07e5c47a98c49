"""What the pytest suite and the runner share: recordings, crash states and check results,
each computed once per process."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .checks import Failure, check_state
from .models import MODELS, SLOW_MODELS, CrashState
from .recorder import Event, Recording
from .workloads import WORKLOADS, Promise, Workload, record

ALL_MODELS = {**MODELS, **SLOW_MODELS}
SEED = 0


@dataclass(frozen=True, slots=True)
class FailedState:
    """A crash state that failed a check, with everything needed to tell and replay it."""

    workload: Workload
    model: str
    event: Event
    state: CrashState
    promise: Promise
    failures: tuple[Failure, ...]
    root: str  # where the workload ran: files may name it (a snapshot's manifest)

    def tail(self, recording: Recording, count: int = 6) -> list[str]:
        """The last ``count`` events up to the crash point."""
        first = max(0, self.event.index - count + 1)
        return [e.describe() for e in recording.events[first : self.event.index + 1]]

    def __str__(self) -> str:
        lines = [
            f"{self.workload.name} / {self.model}: power lost after {self.event.describe()}",
            f"  state: {self.state.variant}",
            f"  acknowledged: {self.promise.acked} records, commits {list(self.promise.commits)}",
        ]
        lines += [f"  {failure}" for failure in self.failures]
        return "\n".join(lines)


@functools.cache
def recording(name: str) -> Recording:
    return record(WORKLOADS[name])


@functools.cache
def crash_states(name: str, model: str) -> tuple[tuple[CrashState, ...], ...]:
    """Per event of workload ``name``, the states ``model`` allows after it."""
    return tuple(tuple(states) for states in ALL_MODELS[model](recording(name), SEED))


_checked: dict[tuple[str, bytes, Promise], tuple[Failure, ...]] = {}


def check_point(name: str, model: str, index: int) -> list[FailedState]:
    """Every state of crash point ``index`` that fails a check (equal states with equal
    promises are checked once per process)."""
    workload = WORKLOADS[name]
    rec = recording(name)
    promise = rec.progress_at_crash(index)
    failed = []
    for state in crash_states(name, model)[index]:
        key = (name, state.digest(), promise)
        if key not in _checked:
            _checked[key] = tuple(check_state(state, promise, workload))
        if _checked[key]:
            failed.append(
                FailedState(
                    workload, model, rec.events[index], state, promise, _checked[key], rec.root
                )
            )
    return failed

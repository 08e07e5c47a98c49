"""Every crash point of every workload under every model: the state a power loss right
after each recorded event may leave opens without repair and keeps every promise
(checks.py). A failing test is named workload-model-event (the event's number and call).
"""

from __future__ import annotations

import pytest

from . import suite
from .models import MODELS, SLOW_MODELS
from .workloads import WORKLOADS


def _points(models: list[str]) -> list[object]:
    points = []
    for name in WORKLOADS:
        try:
            events = suite.recording(name).events
        except Exception:  # the test reports it: one failure, not an error of collection
            points += [pytest.param(name, m, -1, id=f"{name}-{m}-recording") for m in models]
            continue
        for model in models:
            for event in events:
                points.append(
                    pytest.param(
                        name,
                        model,
                        event.index,
                        id=f"{name}-{model}-{event.index:03d}-{event.call}",
                    )
                )
    return points


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.function is test_crash_point:
        metafunc.parametrize(("name", "model", "index"), _points(list(MODELS)))
    elif metafunc.function is test_crash_point_slow:
        metafunc.parametrize(("name", "model", "index"), _points(list(SLOW_MODELS)))


def _check(name: str, model: str, index: int) -> None:
    if index < 0:
        suite.recording(name)  # raises what the workload raised at collection
    failed = suite.check_point(name, model, index)
    if failed:
        recording = suite.recording(name)
        tail = "\n".join(f"    {line}" for line in failed[0].tail(recording))
        pytest.fail(
            f"{len(failed)} crash state(s) fail; the events up to this point:\n{tail}\n"
            + "\n".join(str(f) for f in failed[:3]),
            pytrace=False,
        )


def test_crash_point(name: str, model: str, index: int) -> None:
    _check(name, model, index)


@pytest.mark.slow
def test_crash_point_slow(name: str, model: str, index: int) -> None:
    _check(name, model, index)

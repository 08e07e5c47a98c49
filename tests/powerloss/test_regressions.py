"""Crash states the suite found failing, kept as fixtures (``fixtures/*.json``): each must
now open without repair and keep its promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from .checks import check_state
from .regressions import all_fixtures, load


@pytest.mark.parametrize("path", all_fixtures(), ids=lambda p: p.stem)
def test_regression(path: Path) -> None:
    regression = load(path)
    failures = check_state(regression.state, regression.promise, regression.workload)
    if failures:
        origin = regression.origin
        pytest.fail(
            f"{origin['workload']} / {origin['model']}, power lost after {origin['event']}\n"
            f"  state: {origin['variant']}\n" + "\n".join(f"  {f}" for f in failures),
            pytrace=False,
        )

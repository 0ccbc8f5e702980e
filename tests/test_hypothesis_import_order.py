"""Derandomized Hypothesis tests draw the same examples whatever was imported
before them.

Hypothesis (6.131 on) draws about one choice in twenty from a pool of the
constants written in every *local* module in ``sys.modules``, a pool that
grows as modules are imported. So a ``derandomize=True`` test drew other
examples when the test files collected before it had imported more of the
project: tests/test_crash_anywhere.py passed alone and failed after
tests/test_chain_boot.py (its divergence is a regression test there,
``test_demand_planned_while_its_unload_is_in_flight_is_refused``).
tests/conftest.py empties that pool for the whole session; this test fails
if a Hypothesis upgrade brings it back.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st


def _draws() -> list[tuple[int, float, str]]:
    drawn: list[tuple[int, float, str]] = []

    @settings(max_examples=200, derandomize=True, database=None)
    @given(st.integers(0, 10**12), st.floats(0, 1e6), st.text(max_size=12))
    def collect(i: int, f: float, s: str) -> None:
        drawn.append((i, f, s))

    collect()
    return drawn


def test_derandomized_draws_do_not_depend_on_the_modules_imported(tmp_path: Path) -> None:
    before = _draws()
    # A local module (not under tests/, not named test_*) with constants of its
    # own, as a library module another test file imports would be.
    (tmp_path / "consts_elsewhere.py").write_text(
        "A = 987654321\nB = 123456.789\nC = 'orderbug-constant'\nD = 424242\nE = 0.5151\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module("consts_elsewhere")
        after = _draws()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("consts_elsewhere", None)
    assert after == before

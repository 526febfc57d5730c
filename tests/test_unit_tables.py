"""Unit kinds are handled through one kind of table everywhere (sched.by_kind)."""

from typing import get_args

import pytest

from digenrl.sched import KINDS, Unit, by_kind


def test_by_kind_needs_every_kind():
    with pytest.raises(TypeError, match="sync"):
        by_kind(generate=1, reward=2, train=3, optimizer=4)
    assert set(by_kind(generate=1, reward=2, train=3, optimizer=4, sync=5)) == set(get_args(Unit)) == set(KINDS)


def test_runtime_simulator_and_planner_tables_cover_every_kind():
    pytest.importorskip("ray")
    from digenrl.runtime.backend import STEP_TABLE
    from digenrl.sim.durations import _UNIT_COST as simulated
    from digenrl.sim.here import _UNIT_COST as measured

    for table in (STEP_TABLE, simulated, measured):
        assert set(table) == set(get_args(Unit))

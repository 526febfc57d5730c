"""Units carry RL steps: a run that starts at RL step k (a resumed run) is the run that starts
at 0 with every step and version k higher, unit for unit, at the same times."""

from dataclasses import replace

import pytest

from digenrl.sched import MODES, SchedConfig

from tests.sched.sched_helpers import run


def shifted(unit, k: int):
    """`unit` with its RL step and versions k higher."""
    return replace(unit, **{f: getattr(unit, f) + k for f in ("step", "version", "traj_version") if hasattr(unit, f)})


@pytest.mark.parametrize("mode", MODES)
def test_a_run_from_step_k_is_the_run_from_0_shifted_by_k(mode):
    k = 5
    s0, t0 = run(mode, trained_steps=lambda s: (s % 3, 4))
    sk, tk = run(mode, first_step=k, trained_steps=lambda s: ((s - k) % 3, 4))
    assert sk.version == k + 3 == s0.version + k
    assert len(tk.spans) == len(t0.spans)
    for a, b in zip(t0.spans, tk.spans):
        assert (a.worker, a.kind, a.start, a.end) == (b.worker, b.kind, b.start, b.end)
        plus = [None if x is None else x + k for x in (a.step, a.version)]
        assert shifted(a.unit, k) == b.unit and plus == [b.step, b.version]


def test_first_step_is_a_non_negative_integer():
    with pytest.raises(ValueError, match="first_step"):
        SchedConfig(first_step=-1)
    assert SchedConfig(first_step=3, rl_steps=2).end_step == 5

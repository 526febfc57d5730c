"""Emulated compute: the Ray runtime with sleeping workers agrees with the virtual clock."""

import pytest

from digenrl.runtime.emulated import run_emulated, run_scheduler_emulated
from digenrl.sched import SchedConfig, Scheduler, Worker, kind
from digenrl.sim.engine import run_virtual
from digenrl.trace import staleness


SECONDS = {"generate": 1.0, "reward": 0.2, "train": 0.6, "optimizer": 0.3, "sync": 0.2}


def _fixed(worker, unit):
    """A picklable duration_fn: modelled seconds per unit (Generate: per denoising step)."""
    steps = unit.t_end - unit.t_start if kind(unit) == "generate" else 1
    return SECONDS[kind(unit)] * steps


def test_any_duration_fn_matches_virtual_clock(ray_cluster):
    workers = [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")]

    def sched():
        return Scheduler(SchedConfig(mode="digenrl", rl_steps=3, groups_per_step=4, group_size=2,
                                     num_steps=2), workers)

    virtual = run_virtual(sched(), _fixed)
    real = run_scheduler_emulated(sched(), _fixed, time_scale=0.1)
    assert [(s.worker, s.kind, s.step) for s in real.spans if s.kind == "optimizer"] == \
        [(s.worker, s.kind, s.step) for s in virtual.spans if s.kind == "optimizer"]
    assert real.end == pytest.approx(virtual.end, rel=0.1)  # Ray dispatch: a few ms per unit
    assert max(staleness(real).values()) == 1


def test_testbed_preset_runs_emulated(ray_cluster):
    from digenrl.sim.report import resize
    from digenrl.sim.testbed import load_testbed

    trace = run_emulated(resize(load_testbed("h200x16-flux"), 4), "gap", steps=2, time_scale=0.002)
    assert {s.kind for s in trace.spans} >= {"generate", "train", "optimizer", "sync"}
    assert set(staleness(trace).values()) == {0}

"""Emulated compute: the Ray runtime with sleeping workers agrees with the virtual clock."""

import pytest

from digenrl.config import load_config
from digenrl.runtime.emulated import run_scheduler_emulated
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


def test_emulated_compute_runs_the_configs_own_schedule(ray_cluster, tmp_path):
    """runtime.compute=emulated: the pools, data shape, shards and segments of the config act
    (the testbed gives only hardware and model costs)."""
    from digenrl.runtime.driver import RayTrainer

    cfg = load_config(None, [
        f"run.run_dir={tmp_path}", "run.mode=gap", "model.name=flux", "train.steps=2",
        "runtime.compute=emulated", "runtime.testbed=h200x16-flux", "runtime.time_scale=0.002",
        "runtime.rollout.workers=3", "runtime.trainer.workers=1", "runtime.gen_shard=2",
        "data.groups_per_step=3", "data.group_size=4", "data.micro_batch_groups=1",
        "sampling.num_steps=6", "sampling.window=contiguous", "sampling.window_size=2"])
    trainer = RayTrainer(cfg, progress=False)
    summary = trainer.train()
    trace = trainer.trace
    assert summary["compute"] == "emulated" and (tmp_path / "gantt.png").exists()
    assert set(trace.workers) == {"trainer-0", "rollout-0", "rollout-1", "rollout-2"}
    gens = [s.unit for s in trace.spans if s.kind == "generate"]
    assert len(gens) == 2 * 3 * 2 and {g.samples for g in gens} == {(0, 2), (2, 4)}  # gen_shard=2
    assert all(len(s.unit.t_steps) == 2 for s in trace.spans if s.kind == "train")  # the SDE window
    assert set(staleness(trace).values()) == {0}

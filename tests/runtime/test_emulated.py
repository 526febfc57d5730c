"""Emulated compute: the Ray runtime with sleeping workers agrees with the virtual clock."""

import pytest

from digenrl.config.schema import load_config
from digenrl.runtime.emulated import run_scheduler_emulated
from digenrl.sched import kind
from digenrl.sim.engine import run_virtual
from digenrl.io.trace import staleness

from tests.helpers.schedulers import small_digenrl_scheduler


SECONDS = {"generate": 1.0, "reward": 0.2, "train": 0.6, "optimizer": 0.3, "sync": 0.2}


def _fixed(worker, unit):
    """A picklable duration_fn: modelled seconds per unit (Generate: per denoising step)."""
    steps = unit.t_end - unit.t_start if kind(unit) == "generate" else 1
    return SECONDS[kind(unit)] * steps


def _schedule(trace):
    """What ran where, when, in modelled seconds, in order of completion."""
    return [(s.worker, s.kind, s.step, s.unit, s.start, s.end)
            for s in sorted(trace.spans, key=lambda s: (s.end, s.start, s.worker))]


def test_hidden_latency_runs_the_virtual_clocks_schedule(ray_cluster):
    """latency="hidden": completions are delivered in modelled order whatever the machine's
    load, so the emulated run makes the virtual clock's decisions at its times, exactly."""
    virtual = run_virtual(small_digenrl_scheduler(), _fixed)
    emulated = run_scheduler_emulated(small_digenrl_scheduler(), _fixed, time_scale=0.05, latency="hidden")
    assert _schedule(emulated) == _schedule(virtual)
    assert max(staleness(emulated).values()) == max(staleness(virtual).values()) == 1  # TCSS overlapped


@pytest.mark.timing
def test_any_duration_fn_matches_virtual_clock_in_wall_time(ray_cluster):
    # Wall clock: with latency="real" every Ray round trip counts (a few ms per unit); a busy
    # machine adds more, so this runs on request (-m timing).
    virtual = run_virtual(small_digenrl_scheduler(), _fixed)
    real = run_scheduler_emulated(small_digenrl_scheduler(), _fixed, time_scale=0.1)
    assert real.end == pytest.approx(virtual.end, rel=0.1)


def test_emulated_compute_runs_the_configs_own_schedule(ray_cluster, tmp_path):
    """runtime.compute=emulated: the pools, data shape, shards and segments of the config act
    (the testbed gives only hardware and model costs)."""
    from digenrl.runtime.driver import RayDriver

    cfg = load_config(None, [
        f"run.run_dir={tmp_path}", "run.mode=gap", "model.name=flux", "train.steps=2",
        "runtime.compute=emulated", "runtime.testbed=h200x16-flux", "runtime.time_scale=0.002",
        "runtime.rollout.workers=3", "runtime.trainer.workers=1", "runtime.gen_shard=2",
        "data.groups_per_step=3", "data.group_size=4", "data.micro_batch_groups=1",
        "sampling.num_steps=6", "sampling.window=contiguous", "sampling.window_size=2"])
    trainer = RayDriver(cfg, progress=False)
    summary = trainer.train()
    trace = trainer.trace
    assert summary["compute"] == "emulated" and (tmp_path / "gantt.png").exists()
    assert set(trace.workers) == {"trainer-0", "rollout-0", "rollout-1", "rollout-2"}
    gens = [s.unit for s in trace.spans if s.kind == "generate"]
    assert len(gens) == 2 * 3 * 2 and {g.samples for g in gens} == {(0, 2), (2, 4)}  # gen_shard=2
    assert all(len(s.unit.t_steps) == 2 for s in trace.spans if s.kind == "train")  # the SDE window
    assert set(staleness(trace).values()) == {0}

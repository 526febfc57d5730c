"""Held-out evaluation runs beside training, not in its way (the EvalWorker actor)."""

import pytest

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.runtime import actors, driver
from digenrl.runtime.workers import EvalWorker
from digenrl.sched import OptimizerStep
from tests.helpers.gates import FileGate, wait_until

from .conftest import tiny

STEPS = 3


@pytest.mark.slow  # ~20 s: three evaluations and a gated run (the slow tier, which CI runs)
def test_training_steps_do_not_wait_for_evaluation(ray_cluster, tmp_path, monkeypatch):
    """Every evaluation is held back until the driver has dispatched the run's last optimizer
    step: had training waited for an evaluation, that step would never be dispatched and the
    held evaluation would fail at its deadline, naming why."""
    gate = FileGate(tmp_path / "last_optimizer_step_dispatched")

    class HeldEval(EvalWorker):  # defined here: Ray ships it by value, gate path included
        def evaluate(self, step, weights):
            wait_until(gate.is_open, "the last optimizer step's dispatch (did training wait for an evaluation?)")
            return super().evaluate(step, weights)

    def last_step(rt, wid, unit):
        if type(unit) is OptimizerStep and unit.version == STEPS:
            gate.open()

    monkeypatch.setattr(actors, "EvalWorker", HeldEval)  # runtime/actors.py starts the evaluation actor
    cfg = load_config(None, tiny(tmp_path / "run", "gap", "run.eval_every=1", steps=STEPS))
    summary = driver.RayDriver(cfg, progress=False, on_dispatch=last_step).train()
    assert gate.is_open()
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # written in order, once each
    assert all("eval/reward_mean" in r for r in records)  # every step evaluated (eval_every=1)
    assert all((tmp_path / "run" / "samples" / f"step_{s:06d}.png").exists() for s in range(4))
    assert summary["eval_reward_after"] == pytest.approx(records[-1]["eval/reward_mean"])

"""Held-out evaluation runs beside training, not in its way (the EvalWorker actor)."""

import time

import pytest

from digenrl.config import load_config
from digenrl.outputs import read_metrics
from digenrl.runtime import driver
from digenrl.runtime.workers import EvalWorker

from .conftest import tiny

SLEEP_S = 10.0


class SlowEval(EvalWorker):
    """An evaluation that takes SLEEP_S longer: training must not wait for it."""

    def evaluate(self, step, weights):
        time.sleep(SLEEP_S)
        return super().evaluate(step, weights)


@pytest.mark.slow  # ~50 s: evaluation sleeps on purpose while steps run (keeps the default tier under 15 min)
def test_training_steps_do_not_wait_for_evaluation(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "EvalWorker", SlowEval)
    cfg = load_config(None, tiny(tmp_path, "gap", "run.eval_every=1", steps=3))
    summary = driver.RayTrainer(cfg, progress=False).train()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2, 3]  # written in order, once each
    assert all("eval/reward_mean" in r for r in records)  # every step evaluated (eval_every=1)
    assert all((tmp_path / "samples" / f"step_{s:06d}.png").exists() for s in range(4))
    # Blocking evaluation would put >= SLEEP_S into every step; the run's steps stay short.
    assert max(r["step_s"] for r in records[1:]) < SLEEP_S / 2, [r["step_s"] for r in records[1:]]
    assert summary["eval_reward_after"] == pytest.approx(records[-1]["eval/reward_mean"])

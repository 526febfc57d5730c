"""train.loss=awm is charged the passes its learner issues (learner.Learner._awm_loss): per trained
noise draw one forward + backward per sample, the KL reference's no-grad forward when train.beta
> 0, and no old-policy forward (its old log-prob is the loss forward's, detached). So a Train unit
costs what grpo's and DiffusionNFT's (no kept old policy) cost for the same slots; the runtime side
of the same count is tests/runtime/test_gangs.py::test_awm_on_gangs_runs_as_charged."""

from dataclasses import replace

import pytest

from digenrl.sched import Train, Worker
from digenrl.sim.costs import CostModel
from digenrl.sim.testbed import load_testbed
from digenrl.sim import workload
from digenrl.sim.workload import RunSpec, config_for, duration_fn

SMALL = "small-h200x16-sd35"


def _variant(cfg, loss, beta=0.0, **train):
    sampling = cfg.sampling if loss == "grpo" else replace(cfg.sampling, sde="ode", window_draw="sample")
    return replace(cfg, sampling=sampling, train=replace(cfg.train, loss=loss, beta=beta, **train))


def test_awm_train_unit_costs_the_passes_it_issues():
    tb, cm = load_testbed(SMALL), CostModel()
    base = config_for(tb, RunSpec("digenrl", n_rollout=8), 4)
    trainer, unit = Worker("trainer-7", "trainer"), Train(0, 0, (0,), (0, 1), 0)

    def train_s(cfg):  # the passes: without pulling the rows (awm ships x_T only, grpo x_t and x_t+1)
        fn = duration_fn(cfg, tb, cm)
        return fn(trainer, unit) - fn.overhead_ws.get("trajectory_pull", 0.0)

    for beta in (0.0, 0.01):
        awm = _variant(base, "awm", beta)
        bed = workload.testbed_for(awm, tb)
        assert (bed.kl, bed.old_forward) == (beta > 0, False)
        assert bed.trained_steps == workload.testbed_for(base, tb).trained_steps  # one noise draw per trained slot
        assert train_s(awm) == pytest.approx(train_s(_variant(base, "grpo", beta)))
        assert train_s(awm) == pytest.approx(train_s(_variant(base, "nft", beta)))
    assert train_s(_variant(base, "awm", 0.01)) > train_s(_variant(base, "awm"))  # the reference forward
    # DiffusionNFT's kept old policy is one forward more than AWM issues
    assert train_s(_variant(base, "nft", nft_decay=0.5)) > train_s(_variant(base, "awm"))

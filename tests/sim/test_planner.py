"""The planner's cheap search lands within 5% of brute force over the same grid."""

import pytest

from digenrl.sim.planner import analytic_split, exhaustive, grid, plan
from digenrl.sim.testbed import load_testbed

SMALL = "small-h200x16-sd35"


def test_grid_axes():
    tb = load_testbed(SMALL)
    g = grid(tb, "digenrl")
    assert g["n_rollout"] == list(range(0, 16))  # TAG: no rollout pool at all is a plan too
    assert grid(tb, "gap+tsp")["n_rollout"] == list(range(1, 16))
    assert g["micro_batch_groups"] == [1, 2, 4, 8]  # whole prompt groups (GAP)
    assert g["tsp_chunk"] == [1, 2] and g["tag_segment"] == [1, 2, 4]
    assert "n_rollout" not in grid(tb, "colocated") and "tag_segment" not in grid(tb, "one-step-off")


def test_analytic_split_balances_rates():
    tb = load_testbed(SMALL)
    assert 1 <= analytic_split(tb) <= 15


@pytest.mark.slow  # ~27 s: an exhaustive search beside the planner (default run under 15 min)
@pytest.mark.parametrize("mode", ["digenrl"])
def test_planner_within_5_percent_of_exhaustive(mode):
    tb = load_testbed(SMALL)
    p, e = plan(tb, mode=mode, steps=4), exhaustive(tb, mode=mode, steps=4)
    assert p.throughput >= 0.95 * e.throughput
    assert p.evaluated < e.evaluated  # and it is cheaper


def test_gpus_resizes_split_pool_only():
    p = plan(load_testbed(SMALL), gpus=8, mode="gap", steps=4)
    assert p.gpus == 8
    with pytest.raises(ValueError, match="fixed pools"):
        plan(load_testbed("hetero-h200x8-l40sx16-flux"), gpus=16)


def test_cli_plan(capsys):
    from digenrl.sim.cli import plan_main
    assert plan_main(["--testbed", SMALL, "--gpus", "16", "--mode", "gap"]) == 0
    out = capsys.readouterr().out  # the knobs as the config keys that hold them
    assert "runtime.rollout.workers=" in out and "data.micro_batch_groups=" in out and "n_rollout" not in out

"""run_virtual + trace metrics: throughput ordering, bubble ratios (incl. a hand-computed
case), staleness, step breakdown, Chrome trace and Gantt export."""

import json

import pytest
from digenrl.sched import MODES, Scheduler, SchedConfig, Worker
from digenrl.sim.engine import run_virtual
from digenrl.io.trace import (bubble_ratio, bubble_ratios, plot_gantt, staleness, step_breakdown,
                           write_chrome_trace)

from .sched_helpers import const_cost, run

# Generation of a micro-batch (6 steps x 1.0 s) ~= its training (5 steps x 2 groups x 0.6 s).
BALANCED = {"generate": 1.0, "reward": 0.2, "train": 0.6, "optimizer": 0.5, "sync": 0.5}


@pytest.fixture(scope="module")
def runs():
    out = {m: run(m, cost=BALANCED, rl_steps=3) for m in MODES}
    out["digenrl+tcss"] = run("digenrl", cost=BALANCED, rl_steps=3, tcss=True)
    return out


def test_throughput_ordering(runs):
    t = {m: tr.end for m, (s, tr) in runs.items()}
    assert t["gap"] < t["disagg-sync"]
    assert t["one-step-off"] < t["disagg-sync"]
    assert t["digenrl+tcss"] < t["gap+tsp+tag"] <= t["gap+tsp"] <= t["gap"]
    assert t["digenrl"] <= max(t["gap+tsp+tag"], t["gap+tsp"])  # BTS: never slower than both TAG off and greedy


def test_tsp_shortens_the_tail():
    # 3 micro-batches of 6 trained steps on 3 trainers: without TSP the last micro-batch
    # trains on one trainer while two idle; with TSP its chunks spread over all three.
    kw = dict(cost=BALANCED, groups_per_step=6, num_steps=7, tsp_chunk=2, n_rollout=1)
    assert run("gap+tsp", **kw)[1].end < run("gap", **kw)[1].end


def test_bubble_ratios_in_unit_interval(runs):
    for m, (s, tr) in runs.items():
        for step in [None, 0, 1, 2]:
            for pool, b in bubble_ratios(tr, step).items():
                assert 0.0 <= b <= 1.0, (m, step, pool, b)


def test_bubble_ratio_hand_computed():
    # disagg-sync, 1 rollout + 1 trainer, 2 RL steps of one group, 2 denoising steps,
    # one trained step. Costs: generate 1 s/step, reward 1, train 3, optimizer 1, sync 1.
    #   rollout: gen [0,2] reward [2,3]   sync [7,8] gen [8,10] reward [10,11]
    #   trainer: train [3,6] opt [6,7]                 train [11,14] opt [14,15]
    # rollout busy 3+1+3 = 7 of 15 -> 8/15 idle; trainer busy 8 of 15 -> 7/15 idle.
    cfg = SchedConfig(mode="disagg-sync", rl_steps=2, groups_per_step=1, num_steps=2,
                      trained_steps=(0,))
    s = Scheduler(cfg, [Worker("r0", "rollout"), Worker("t0", "trainer")])
    cost = {"generate": 1.0, "reward": 1.0, "train": 3.0, "optimizer": 1.0, "sync": 1.0}
    tr = run_virtual(s, const_cost(cost))
    assert tr.end == 15.0
    assert bubble_ratios(tr) == pytest.approx({"rollout": 8 / 15, "trainer": 7 / 15})
    # step 1 spans [7, 15] without its sync... the sync belongs to step 0 (produced v1)
    assert bubble_ratio(tr, "rollout", 8.0, 15.0) == pytest.approx(4 / 7)
    bd = step_breakdown(tr)
    assert bd[0]["span_s"] == 7.0 and bd[0]["train_ws"] == 3.0 and bd[0]["sync_ws"] == 1.0
    assert bd[1]["generate_done_s"] == 2.0 and bd[1]["train_done_s"] == 6.0


def test_staleness_per_step(runs):
    assert set(staleness(runs["gap+tsp+tag"][1]).values()) == {0}
    assert set(staleness(runs["digenrl"][1]).values()) == {0}  # on-policy by default
    st = staleness(runs["digenrl+tcss"][1])
    assert st[0] == 0 and max(st.values()) == 1


def test_exports(runs, tmp_path):
    s, tr = runs["digenrl+tcss"]
    p = tmp_path / "t.json"
    write_chrome_trace(tr, str(p))
    ev = json.loads(p.read_text())["traceEvents"]
    procs = {e["args"]["name"] for e in ev if e["name"] == "process_name"}
    threads = [e for e in ev if e["name"] == "thread_name"]
    assert procs == {"rollout", "trainer"} and len(threads) == 6
    assert sum(e["ph"] == "X" for e in ev) == len(tr.spans)
    plot_gantt(tr, str(tmp_path / "g.png"), step=1)
    assert (tmp_path / "g.png").stat().st_size > 1000

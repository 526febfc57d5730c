"""sim.spot: spot rollout pools in testbeds, run under preemption on the virtual clock, priced
and planned (issue 30 part 3). Every run is seeded or given its events: no timing."""

import dataclasses
from collections import Counter

import pytest

from digenrl.config.schema import load_config
from digenrl.sched import SchedConfig, Scheduler, Worker
from digenrl.sched.preemption import (
    Join,
    Notice,
    SpotSpec,
    draw,
    read_trace,
    write_trace,
)
from digenrl.sched.units import rows
from digenrl.sim.cli import plan_main, simulate_main
from digenrl.sim.costs import default_cost_model
from digenrl.sim.devices import (
    SPOT_INTERRUPTIONS_PER_HOUR,
    SPOT_NOTICE_S,
    SPOT_PRICES,
    SPOT_REPLACE_S,
    get_device,
)
from digenrl.sim.engine import run_virtual
from digenrl.sim.report import spec_duration_fn, steady_window
from digenrl.sim.spot import mixes, plan_spot, run_spot, sizes, spot_lines, with_spot
from digenrl.sim.testbed import Testbed, TestbedError
from digenrl.sim.workload import RunSpec
from tests.sched.sched_helpers import const_cost, done

# 2 H200 trainers, 4 L40S rollout workers on spot; a run of 12 RL steps is ~90 virtual seconds
TB = {"name": "spot-small", "pools": [
    {"name": "trainers", "count": 2, "device": "H200", "role": "trainer"},
    {"name": "rollout", "count": 4, "device": "L40S", "role": "rollout", "gpus_per_node": 4,
     "spot": {"interruptions_per_hour": 200.0, "notice_s": 30.0, "replace_s": 20.0}}],
    "model": "sd3.5-medium", "height": 512, "width": 512, "denoise_steps": 8, "trained_steps": 4,
    "group_size": 4, "groups_per_step": 4, "micro_batch": 2, "rollout_batch": 4}
STEPS = 12
DIGENRL = RunSpec("digenrl")


def make_testbed(**spot) -> Testbed:
    d = {**TB, "pools": [dict(p) for p in TB["pools"]]}
    if spot:
        d["pools"][1]["spot"] = spot
    return Testbed.from_dict(d)


def trained_once(tb: Testbed, spec: RunSpec, trace) -> bool:
    """Every (step, group, sample, trained t) of the run trained exactly once (completed Train spans)."""
    c = spec_duration_fn(tb, spec, STEPS, default_cost_model())[1].sched
    want = Counter((k, g, i, t) for k in range(c.rl_steps) for g in range(c.groups_per_step)
                   for i in range(c.samples_per_group) for t in c.trained(k))
    got = Counter()
    for s in done(trace, "train"):
        a, b = rows(s.unit, c.samples_per_group)
        for r in range(a, b):
            got.update((s.unit.step, s.unit.groups[r // c.samples_per_group], r % c.samples_per_group, t)
                       for t in s.unit.t_steps)
    return got == want


# ----------------------------------------------------------------------------- part 1: testbed keys


def test_a_spot_pool_takes_its_devices_estimates_for_the_keys_it_leaves_out():
    tb = make_testbed(price=0.5)
    assert tb.pools[1].spot == SpotSpec(0.5, SPOT_INTERRUPTIONS_PER_HOUR, SPOT_NOTICE_S, SPOT_REPLACE_S)
    assert make_testbed(notice_s=30, replace_s=None).pools[1].spot == SpotSpec(SPOT_PRICES["L40S"],
                                                                          SPOT_INTERRUPTIONS_PER_HOUR, 30.0, None)
    assert Testbed.from_dict({**TB, "pools": [TB["pools"][0], {**TB["pools"][1], "spot": None}]}).pools[1].spot is None


@pytest.mark.parametrize("pools, message", [
    ([TB["pools"][0], {**TB["pools"][1], "spot": {"prize": 1.0}}], r"'pools\[1\]\.spot\.prize': unknown key"),
    ([TB["pools"][0], {**TB["pools"][1], "spot": {"notice_s": -1}}], r"'pools\[1\]\.spot'.*spot\.notice_s"),
    ([TB["pools"][0], {**TB["pools"][1], "spot": {"price": "cheap"}}], r"'pools\[1\]\.spot\.price': must be a number"),
    ([TB["pools"][0], {**TB["pools"][1], "spot": 3}], r"'pools\[1\]\.spot' must be a mapping"),
    ([TB["pools"][0], {**TB["pools"][1], "device": "L4", "count": 4, "spot": {}}],
     r"'pools\[1\]\.spot\.price': no spot price estimate for device 'L4'"),
    ([{**TB["pools"][0], "spot": {"price": 1.0}}, TB["pools"][1]], r"'pools\[0\]\.spot': only a pool of role 'rollout'"),
])
def test_a_bad_spot_key_is_refused_with_the_key_named(pools, message):
    with pytest.raises(TestbedError, match=message):
        Testbed.from_dict({**TB, "pools": pools})


# ----------------------------------------------------------------------------- part 2: runs


def test_a_deadline_for_a_worker_that_already_left_is_skipped_and_a_refused_drain_waits_for_it():
    # gap, one rollout worker: its drain is refused (the last one, no TAG); the deadline takes it, its
    # Generate is regenerated on the replacement, which joins later; r1's notice comes when r1 has left
    c = SchedConfig(mode="gap", rl_steps=2, groups_per_step=4, micro_batch_groups=2, num_steps=6, samples_per_group=4)
    s = Scheduler(c, [Worker("r0", "rollout"), Worker("t0", "trainer")])
    tr = run_virtual(s, const_cost(samples_per_group=4), drains=[(0.5, "r0")], deadlines=[(1.0, "r0")],
                     joins=[(3.0, Worker("r0+1", "rollout"))])
    assert tr.preemption == {"refused": [(0.5, "r0")], "missed": [(1.0, "r0")]}
    assert tr.alive["r0"][1] == 1.0 and s.done
    assert [x.extra for x in tr.spans if x.worker == "r0" and x.extra] == [{"lost": True}]
    # a deadline after the worker was drained: nothing happens (the engine would raise on a second loss)
    s = Scheduler(c, [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    tr = run_virtual(s, const_cost(samples_per_group=4), drains=[(0.5, "r1")], deadlines=[(100.0, "r1")])
    assert tr.preemption == {"refused": [], "missed": []} and tr.alive["r1"][1] < 100.0 and s.done


def test_a_notice_long_enough_drains_and_one_cut_short_regenerates_and_both_train_exactly_once():
    tb = make_testbed()
    first = Notice(10.0, "rollout-1", 1000.0)  # ample: the worker finishes its unit and leaves
    r = run_spot(tb, DIGENRL, STEPS, events=[first])
    assert (r.notices, r.drained, r.deadlines_missed, r.lost_gpu_s, r.regenerated_steps) == (1, 1, 0, 0.0, 0)
    assert trained_once(tb, DIGENRL, r.trace)
    plain = run_spot(tb, DIGENRL, STEPS, events=[]).trace
    gen = next(s for s in done(plain, "generate") if s.worker == "rollout-1" and s.start > 10.0)
    at = (gen.start + gen.end) / 2  # no time (notice_s 0): the deadline takes it mid-Generate
    r = run_spot(tb, DIGENRL, STEPS, events=[Notice(at, "rollout-1", 0.0), Join(at + 5.0, "rollout-1+1", "rollout-1")])
    assert (r.notices, r.drained, r.deadlines_missed, r.joins) == (1, 0, 1, 1)
    assert r.lost_gpu_s > 0 and r.regenerated_samples > 0
    # the cut unit ran again whole: its samples times its denoising steps (rollout_segment 0: all 8)
    assert r.regenerated_steps == r.regenerated_samples * 8
    assert trained_once(tb, DIGENRL, r.trace)
    assert "rollout-1+1" in r.trace.alive and any(s.worker == "rollout-1+1" for s in done(r.trace, "generate"))


def test_the_seeded_process_is_a_function_of_the_seed_and_a_trace_file_replays_it(tmp_path):
    tb = make_testbed()
    a, b = run_spot(tb, DIGENRL, STEPS, seed=3), run_spot(tb, DIGENRL, STEPS, seed=3)
    assert a.events == b.events and a.throughput == b.throughput and a.notices >= 2
    assert run_spot(tb, DIGENRL, STEPS, seed=4).events != a.events
    assert run_spot(tb, DIGENRL, STEPS).seed == 0  # the run's run.seed
    assert trained_once(tb, DIGENRL, a.trace)
    path = tmp_path / "preemptions.jsonl"
    write_trace(path, a.events)
    c = run_spot(tb, DIGENRL, STEPS, events=read_trace(path))
    assert (c.throughput, c.usd_per_1k, c.notices, c.deadlines_missed, c.regenerated_steps) == \
        (a.throughput, a.usd_per_1k, a.notices, a.deadlines_missed, a.regenerated_steps)
    # the draw covers the run: spot workers are the pool's, their lines' events are draw()'s own
    lines = spot_lines(spec_duration_fn(tb, DIGENRL, STEPS, default_cost_model())[2].layout)
    assert list(lines) == [f"rollout-{i}" for i in range(4)]
    horizon = max(e.at_s for e in a.events) + 1.0
    assert a.events == draw(tb.pools[1].spot, list(lines), horizon, 3)


def test_a_trace_naming_a_worker_the_run_lacks_is_refused():
    with pytest.raises(ValueError, match="'rollout-9', not a rollout worker"):
        run_spot(make_testbed(), DIGENRL, STEPS, events=[Notice(1.0, "rollout-9", 5.0)])


def test_on_demand_cost_is_the_window_times_the_hourly_price_and_spot_bills_its_workers_alive():
    # no reclaims (rate 0): the same run; $ per 1,000 samples = (2 x H200 + 4 x price) x window / samples
    od = run_spot(with_spot(make_testbed(), 0, None), DIGENRL, STEPS)
    sp = run_spot(make_testbed(interruptions_per_hour=0.0, price=0.25), DIGENRL, STEPS)
    t0, t1, n = steady_window(od.trace, STEPS)
    samples = 16 * n
    h200, l40s = get_device("H200").usd_per_hour, get_device("L40S").usd_per_hour
    assert od.usd_per_1k == pytest.approx((2 * h200 + 4 * l40s) * (t1 - t0) / 3600 / samples * 1000)
    assert sp.usd_per_1k == pytest.approx((2 * h200 + 4 * 0.25) * (t1 - t0) / 3600 / samples * 1000)
    assert sp.throughput == od.throughput == samples / (t1 - t0)
    assert (od.notices, od.lost_gpu_s, od.regenerated_steps, sp.notices) == (0, 0.0, 0, 0)
    # a reclaimed worker is not billed between its deadline and its replacement's join
    gone = run_spot(make_testbed(interruptions_per_hour=0.0, price=0.25, replace_s=None), DIGENRL, STEPS,
                    events=[Notice(t0 - 1.0, "rollout-0", 0.0)])
    t0g, t1g, ng = steady_window(gone.trace, STEPS)
    assert gone.usd_per_1k == pytest.approx((2 * h200 + 3 * 0.25) * (t1g - t0g) / 3600 / (16 * ng) * 1000)


# ----------------------------------------------------------------------------- part 3: plan --spot


def test_mixes_go_by_whole_nodes_or_halves():
    tb = make_testbed()
    assert mixes(tb.pools[1]) == [0, 2, 4]
    big = dataclasses.replace(tb.pools[1], count=16, gpus_per_node=8)
    assert mixes(big) == [0, 8, 16]
    split = with_spot(tb, 2, SpotSpec(0.3, 1.0, 30.0, 60.0))
    assert [(p.name, p.count, p.spot is not None) for p in split.pool("rollout")] == \
        [("rollout-spot", 2, True), ("rollout-on-demand", 2, False)]
    lay = spec_duration_fn(split, DIGENRL, STEPS, default_cost_model())[2].layout
    assert list(spot_lines(lay)) == ["rollout-0", "rollout-1"]  # the spot pool comes first


def test_plan_spot_rows_price_each_size_and_mix_and_cheaper_spot_costs_less_at_the_same_throughput():
    tb = make_testbed(interruptions_per_hour=0.0)
    rows_ = plan_spot(tb, STEPS, seeds=2, spec=DIGENRL)
    assert [r.label for r in rows_] == ["4x L40S: on-demand", "4x L40S: 2 spot", "4x L40S: all spot"]
    assert len({r.throughput for r in rows_}) == 1  # no reclaims: the same schedule
    assert rows_[0].usd_per_1k > rows_[1].usd_per_1k > rows_[2].usd_per_1k
    assert all(r.notices == 0 and r.spec == DIGENRL for r in rows_)
    busy = plan_spot(make_testbed(), STEPS, seeds=2, spec=DIGENRL)  # 200 reclaims per worker-hour
    assert busy[0].notices == 0 and busy[2].notices > busy[1].notices > 0
    assert busy[2].notices_per_hour == 4 * 200.0
    # sizes: whole nodes up to the pool's count, each planned for its own size
    two_nodes = Testbed.from_dict({**TB, "pools": [TB["pools"][0], {**TB["pools"][1], "count": 8}]})
    assert sizes(two_nodes.pools[1]) == [4, 8]
    labels = [r.label for r in plan_spot(two_nodes, 6, seeds=1, spec=DIGENRL)]
    assert labels == ["4x L40S: on-demand", "4x L40S: 2 spot", "4x L40S: all spot",
                      "8x L40S: on-demand", "8x L40S: 4 spot", "8x L40S: all spot"]


def test_plan_spot_prints_keys_train_accepts_and_pools_a_testbed_accepts(tmp_path, capsys):
    import yaml

    path = tmp_path / "tb.yaml"
    path.write_text(yaml.safe_dump(TB))
    assert plan_main(["--testbed", str(path), "--spot", "--seeds", "1", "--steps", "6", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    keys = next(line for line in out.splitlines() if "digenrl train keys:" in line).split(": ", 1)[1]
    load_config(overrides=keys.split())  # raises on a key digenrl train refuses
    # the runtime's mark is printed exactly when the cheapest row is all spot and this tree's
    # digenrl train takes it; a mix says why not (at 200 reclaims/worker-h either can be cheapest)
    try:
        load_config(overrides=["runtime.rollout.preemptible=true"])
        knows = True
    except ValueError:
        knows = False
    cheapest = next(line for line in out.splitlines() if line.startswith("cheapest per 1,000 samples:"))
    all_spot = cheapest.endswith(": all spot")
    assert ("runtime.rollout.preemptible=true" in keys) == (knows and all_spot)
    if all_spot:
        assert knows or "runtime.rollout.preemptible=true not added: this digenrl train does not know the key" in out
    else:
        assert "runtime.rollout.preemptible=true not added: a mix" in out
    pools = [yaml.safe_load(line.strip()[2:]) for line in out.splitlines() if line.strip().startswith("- {")]
    tb = Testbed.from_dict({**TB, "pools": pools})
    assert tb.n_gpus == 6 and any(p.spot is not None for p in tb.pools)
    assert plan_main(["--testbed", str(path), "--spot", "--mode", "gap"]) == 2
    assert plan_main(["--testbed", str(path), "--seeds", "3"]) == 2  # --seeds goes with --spot


def test_simulate_takes_the_runtimes_preemption_key_and_refuses_other_keys(tmp_path, capsys):
    import yaml

    path = tmp_path / "tb.yaml"
    path.write_text(yaml.safe_dump(TB))
    trace = tmp_path / "p.jsonl"
    write_trace(trace, [Notice(10.0, "rollout-1", 0.0), Join(15.0, "rollout-1+1", "rollout-1")])
    assert simulate_main(["--testbed", str(path), "--modes", "digenrl", "--steps", "6", "--jobs", "1",
                          f"runtime.rollout.preemptions={trace}"]) == 0
    out = capsys.readouterr().out
    assert f"digenrl under preemption (trace {trace}" in out and "1 deadlines missed" in out
    assert simulate_main(["--testbed", str(path), "--modes", "digenrl", "runtime.rollout.workers=3"]) == 2
    assert "unknown override 'runtime.rollout.workers'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_docs_plan_spot_block_is_what_the_command_prints(capsys):
    """docs/guides/planning.md, "Which pool to rent", shows
    `digenrl plan --testbed hetero-h200x8-l40sx16-flux --spot`."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "planning.md").read_text()
    block = doc.split("<!-- plan-spot:")[1].split("<!-- end plan-spot -->")[0]
    shown = block.split("```\n")[1]
    assert plan_main(["--testbed", "hetero-h200x8-l40sx16-flux", "--spot"]) == 0

    def figures(text):  # the keys line depends on whether this tree's train knows the runtime's spot key
        return [line for line in text.splitlines() if "preemptible" not in line and "train keys:" not in line]
    assert figures(capsys.readouterr().out) == figures(shown)

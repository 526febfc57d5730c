"""The planner's cheap search lands within 5% of brute force over the same grid."""

import itertools
import os

import pytest

from digenrl.sim.planner import analytic_split, exhaustive, grid, plan, useful_gpus
from digenrl.sim.report import run_spec
from digenrl.sim.testbed import load_testbed, resize
from digenrl.sim.workload import RunSpec, fitting_gang

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


def test_analytic_split_gives_the_trainers_what_a_step_can_use():
    # 32 samples a step on 4,096 GPUs: at most 32 rollout GPUs generate and 32 x 2 trained steps
    # x a 1-GPU gang train at once, so the split starts where the search ended from the rate
    # balance (1,359 rollout GPUs, 418 points in 87 s): 4,032 rollout GPUs, 64 trainers
    tb = resize(load_testbed(SMALL), 4096)
    assert fitting_gang(tb, 64) == 1
    assert useful_gpus(tb) == (32, 32 * 2 * 1)
    assert analytic_split(tb) == 4096 - 64
    # where the pools can use every GPU, the rate balance alone (the 16-GPU preset: 32 + 64 > 16)
    small = load_testbed(SMALL)
    assert sum(useful_gpus(small)) > small.n_gpus and analytic_split(small) == 5


def test_a_step_never_uses_more_gpus_than_useful_gpus_says():
    # the bound holds at the knobs with the most units (one group a micro-batch, one trained step
    # a chunk, every shard), on pools larger than it: the most rollout GPUs generating and
    # trainer GPUs training at one time, read off the trace, stay within P and T
    tb = resize(load_testbed(SMALL), 256)
    p, t = useful_gpus(tb)
    spec = RunSpec("gap+tsp", n_rollout=128, micro_batch_groups=1, tsp_chunk=1, gen_shard=4, train_shard=4)
    r = run_spec(tb, spec, steps=3, keep_trace=True)
    role = r.trace.workers
    for kind, pool, bound in (("generate", "rollout", p), ("train", "trainer", t)):
        edges = sorted(x for sp in r.trace.spans if sp.kind == kind and role[sp.worker] == pool
                       for x in ((sp.start, 1), (sp.end, -1)))  # (an end before a start at one time)
        most = max(itertools.accumulate(d for _, d in edges))
        assert 0 < most <= bound, (kind, most, bound)


def test_a_tag_mode_searches_the_all_trainer_regime_with_its_own_knobs(monkeypatch):
    # A landscape with two regimes, as the 64-GPU testbed has (a split at 26.9 samples/s, every
    # GPU a trainer at 33.8): at the split's knobs, no rollout pool is the worst point of the
    # split's line, and only with its own knob (the longest TAG segment) is it the best plan.
    # The descent from the split cannot reach it; the start that holds the split at 0 does.
    from types import SimpleNamespace

    from digenrl.sim import planner

    tb = load_testbed(SMALL)
    segs = grid(tb, "digenrl")["tag_segment"]

    def fake(ctx, spec, incumbent=None):
        if spec.n_rollout == 0:
            tput = 10.0 if spec.tag_segment == segs[-1] else 1.0
        else:
            tput = 5.0 - 0.01 * abs(spec.n_rollout - 5)
        return SimpleNamespace(throughput=tput, step_s=1.0 / tput, spec=RunSpec("digenrl", n_rollout=spec.n_rollout,
                                                                                 tag_segment=spec.tag_segment, gang=1)), 1

    monkeypatch.setattr(planner, "_evaluate", fake)
    best = plan(tb, mode="digenrl", start={**planner.default_point(tb, "digenrl", grid(tb, "digenrl")),
                                           "tag_segment": segs[0]})
    assert best.throughput == 10.0 and best.spec.n_rollout == 0 and best.spec.tag_segment == segs[-1]
    # a mode without TAG has no such regime (its split starts at 1): no start is added there
    assert grid(tb, "gap+tsp")["n_rollout"][0] == 1


@pytest.mark.slow  # ~27 s: an exhaustive search beside the planner (default run under 15 min)
@pytest.mark.parametrize("mode", ["digenrl"])
def test_planner_within_5_percent_of_exhaustive(mode):
    tb = load_testbed(SMALL)
    p, e = plan(tb, mode=mode, steps=4), exhaustive(tb, mode=mode, steps=4)
    assert p.throughput >= 0.95 * e.throughput
    assert p.evaluated < e.evaluated  # and it is cheaper


@pytest.mark.slow  # two plans, ~5 s on 2 shared cores: the default tier keeps its 5 minutes
def test_plan_with_fixed_fields_searches_with_them_set():
    # plan(fixed=): the fields on every point tried, so the plan is the best one with them (the
    # paper ablation's +TCSS row), not the best one without them with the fields set on top; seeded
    # with the plan without them, it is at least as fast as that overlay
    from dataclasses import replace

    from digenrl.sim.planner import resize
    from digenrl.sim.report import run_spec

    tb = resize(load_testbed(SMALL), 8)
    on = plan(tb, mode="digenrl", steps=4)
    p = plan(tb, mode="digenrl", steps=4, fixed={"tcss_fraction": 0.5}, extra_starts=(on.spec.knobs(),))
    assert p.spec.tcss_fraction == 0.5 and on.spec.tcss_fraction in (None, 0.0)
    assert p.throughput >= run_spec(tb, replace(on.spec, tcss_fraction=0.5), 4).throughput * (1 - 1e-9)
    with pytest.raises(ValueError, match="searched axes"):
        plan(tb, mode="digenrl", steps=4, fixed={"tsp_chunk": 1})


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


# ----------------------------------------------------------------------------- exact pruning (issue 24)

from digenrl.sim.simulate import ROWS  # noqa: E402


def _same_plan(tb, label: str) -> None:
    mode, style = ROWS[label]
    fast, ref = plan(tb, mode=mode, style=style), plan(tb, mode=mode, style=style, prune=False)
    assert fast.spec == ref.spec, (tb.name, label, fast.spec, ref.spec)
    assert fast.step_s == pytest.approx(ref.step_s, rel=1e-9)  # lag-0 rows: 3 steps measure what 12 do


@pytest.mark.parametrize("label", ["colocated-ideal", "verl-omni", "disagg-sync", "one-step-off",
                                   *(pytest.param(m, marks=pytest.mark.slow) for m in ("gap+tsp", "gap+tsp+tag")),
                                   "digenrl"])  # digenrl searches every axis gap+tsp(+tag) does
def test_pruned_search_chooses_what_the_unpruned_one_does(label):
    """Pruning by lower bounds, early stops and 3-step lag-0 runs change what is simulated, not the plan."""
    _same_plan(load_testbed(SMALL), label)


# one preset per model family that plans fast enough for the slow tier, a heterogeneous one among them
SAME_PLAN_PRESETS = ("h200x16-flux", "h200x16-qwen", "h200x16-wan14b", "hetero-h200x8-l40sx16-flux")


@pytest.mark.slow
@pytest.mark.parametrize("preset", SAME_PLAN_PRESETS)
def test_pruned_search_chooses_what_the_unpruned_one_does_on_every_preset(preset):
    tb = load_testbed(preset)
    for label in ("digenrl", "one-step-off") + (("colocated-ideal",) if tb.split_pool else ()):
        _same_plan(tb, label)


def test_point_bound_is_below_every_run():
    """report.point_bound (and the early stop built on it) is a lower bound: random points of every row
    on two testbeds, 12 steps (lag-1) or ON_POLICY_STEPS (lag-0) as the planner simulates them."""
    import random

    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.planner import ON_POLICY_STEPS, _spec, snap
    from digenrl.sim.report import ON_POLICY, point_bound, run_spec, run_spec_within

    cm, rng, n = default_cost_model(), random.Random(7), 0
    for name in (SMALL, "hetero-h200x8-l40sx16-flux"):
        tb = load_testbed(name)
        for label, (mode, style) in ROWS.items():
            if mode == "colocated" and name != SMALL:
                continue
            steps = ON_POLICY_STEPS if mode in ON_POLICY else 12
            for _ in range(3):
                spec = _spec(mode, snap(tb, {k: rng.choice(v) for k, v in grid(tb, mode, style).items()}), style)
                try:
                    r = run_spec(tb, spec, steps, cm)
                except ValueError:
                    continue
                b = point_bound(tb, spec, steps, cm)
                assert b.step_s <= r.step_s * (1 + 1e-12), (name, label, spec, b, r.step_s)
                stopped = run_spec_within(tb, spec, steps, cm, r.step_s * 0.999, b)
                assert isinstance(stopped, float) <= (stopped if isinstance(stopped, float) else 0) <= r.step_s * (1 + 1e-12)
                n += 1
    assert n >= 20


def test_a_lag0_step_holds_all_its_work_so_every_step_is_at_least_its_share_of_it():
    """digenrl without TCSS is lag 0 like report.ON_POLICY's modes: a step's Generate, Reward,
    Train and OptimizerStep units all run between the optimizer step before it and its own, so
    each step takes at least the step's useful work over every GPU. point_bound says so
    (Bound.trainer_step_s, which the early stop charges every step left of the window), and every
    step of a 12-step run, the first included, is at least that long."""
    import random

    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.planner import _spec, snap
    from digenrl.sim.report import point_bound, useful_work

    cm, rng, n = default_cost_model(), random.Random(11), 0
    for name in (SMALL, "h200x16-qwen"):
        tb = load_testbed(name)
        for mode in ("digenrl", "gap+tsp+tag"):
            for _ in range(4):
                spec = _spec(mode, snap(tb, {k: rng.choice(v) for k, v in grid(tb, mode).items()}), None)
                try:
                    r = run_spec(tb, spec, 12, cm, keep_trace=True)
                except ValueError:
                    continue
                b = point_bound(tb, spec, 12, cm)
                u = useful_work(tb, tb.pools[0].device, cm)
                every = (sum(u.values()) - u["optimizer"]) / tb.n_gpus
                assert b.trainer_step_s > every, (name, spec, b)  # (lag 1 would be train alone per trainer)
                ends: dict = {}
                for sp in r.trace.spans:
                    if sp.kind == "optimizer":
                        ends[sp.step] = max(ends.get(sp.step, 0.0), sp.end)
                steps = [ends[0]] + [ends[k] - ends[k - 1] for k in range(1, 12)]
                assert min(steps) >= b.trainer_step_s * (1 - 1e-12), (name, spec, b, steps)
                n += 1
    assert n >= 10


def test_a_lag0_run_stopped_as_its_window_closes_measures_what_the_whole_run_does(monkeypatch):
    """report.run_spec_within stops a lag-0 run once optimizer step b ended and the weight syncs
    of the version it made ended too (run_virtual(until_synced=)): the drain step is not
    simulated. The step time, throughput, bubbles and staleness are those of the whole run, to
    the bit, on random points of every lag-0 row (digenrl without TCSS among them), 3 and 12
    steps, on a homogeneous and a heterogeneous testbed; a lag-1 run is not stopped."""
    import random

    from digenrl.sim import report
    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.planner import _spec, snap
    from digenrl.sim.report import run_spec_within

    cm, rng, n = default_cost_model(), random.Random(5), 0
    stopped, real = [], report.run_virtual

    def recording(*args, **kw):
        trace = real(*args, **kw)
        stopped.append(trace.stopped)
        return trace

    monkeypatch.setattr(report, "run_virtual", recording)
    for name in (SMALL, "hetero-h200x8-l40sx16-flux"):
        tb = load_testbed(name)
        for label, (mode, style) in ROWS.items():
            if mode == "colocated" and name != SMALL:
                continue
            memory = mode != "colocated" or style == "colocated-ideal"  # a peer's recipe: as simulate runs it
            for steps in (3, 12):
                spec = _spec(mode, snap(tb, {k: rng.choice(v) for k, v in grid(tb, mode, style).items()}), style)
                try:
                    whole = run_spec(tb, spec, steps, cm, check_memory=memory, keep_trace=True)
                except ValueError:
                    continue
                got = run_spec_within(tb, spec, steps, cm, float("inf"), None, memory)
                lag0 = report.spec_duration_fn(tb, spec, steps, cm, memory)[1].sched.lag == 0
                assert stopped[-1] == lag0 and not stopped[-2]
                assert (got.step_s, got.throughput, got.bubble, got.staleness_max) == (
                    whole.step_s, whole.throughput, whole.bubble, whole.staleness_max), (name, label, steps, spec)
                n += lag0
    assert n >= 12


def test_cli_plan_names_the_smallest_change_when_nothing_fits(tmp_path, capsys):
    """A 14B video full fine-tune on 2 L40S (48 GB): no plan fits, even one gang of both GPUs with the
    AdamW state on the host; plan says so with the memory figure and names the smallest change."""
    from digenrl.sim.cli import plan_main

    yaml = tmp_path / "tiny.yaml"
    yaml.write_text("name: tiny\npools:\n  - {name: l40s, count: 2, device: L40S, role: any, gpus_per_node: 8}\n"
                    "model: wan2.1-14b\nheight: 480\nwidth: 832\nframes: 33\ndenoise_steps: 10\ntrained_steps: 4\n"
                    "group_size: 4\ngroups_per_step: 4\nmicro_batch: 2\nrollout_batch: 1\nlora: false\n"
                    "reward: videoalign\nweight_sync: nccl\n")
    assert plan_main(["--testbed", str(yaml)]) == 2
    err = capsys.readouterr().err
    assert "GiB per GPU" in err and "smallest change that makes one fit: lora: true" in err


# The slow tier: three searches on a 20B model's 4-GPU grid. The default tier plans this testbed's
# every row (tests/sim/test_invariants.py) and writes a plan `digenrl train` runs (tests/test_contract.py).
@pytest.mark.slow
def test_cli_plan_prints_a_runnable_plan_where_no_replica_fits(capsys, tmp_path):
    """veRL-Omni's Qwen-Image full fine-tune on 4 H200: no GPU holds a replica (so not the runtime's
    colocated mode); DigenRL's plan is an FSDP trainer gang that holds the state, written as a
    config `digenrl train` loads."""
    from pathlib import Path

    from digenrl.config.schema import load_config
    from digenrl.sim.cli import plan_main

    tb = Path(__file__).parent / "testbeds" / "qwen-full-h200x4.yaml"
    assert plan_main(["--testbed", str(tb), "--out", str(tmp_path / "plan.yaml")]) == 0
    out = capsys.readouterr().out
    assert "run.mode=digenrl" in out and "runtime.trainer.shard=fsdp" in out
    cfg = load_config(str(tmp_path / "plan.yaml"), [])
    assert cfg.run.mode == "digenrl" and cfg.runtime.trainer.gang >= 2


@pytest.mark.slow
def test_a_search_on_two_processes_chooses_what_one_process_does():
    """jobs(2) runs each search line's points side by side, against the line's first incumbent,
    two descents taking turns a line at a time (planner._descents), and a descent going on alone
    starts points of its next line ahead: the same plan, the same figures, whatever each process
    pruned or cut short. Some points the sweep asks for must have been started before it asked
    (`_Evaluator.running`)."""
    tb = load_testbed(SMALL)
    labels = ("digenrl", "one-step-off")
    code = ("from digenrl.sim import planner\n"
            "from digenrl.sim.planner import jobs, plan\n"
            "from digenrl.sim.testbed import load_testbed\n"
            "from tests.sim.test_planner import ROWS, SMALL\n"
            "ahead, call = [0], planner._Evaluator.__call__\n"
            "def counting(self, point, incumbent=None):\n"
            "    ahead[0] += self._key(point)[1] in self.running\n"
            "    return call(self, point, incumbent)\n"
            "planner._Evaluator.__call__ = counting\n"
            "with jobs(2):\n"
            f"    got = [(p.spec, p.step_s, p.throughput) for p in (plan(load_testbed(SMALL), mode=ROWS[l][0], "
            f"style=ROWS[l][1]) for l in {labels!r})]\n"
            "print(ahead[0])\n"
            "print(repr(got))\n")
    out = _fresh_process(code, lines=2)  # forks its pool there (sim/planner._fork_safe)
    one = [(p.spec, p.step_s, p.throughput) for p in (plan(tb, mode=ROWS[l][0], style=ROWS[l][1]) for l in labels)]
    assert out[1] == repr(one)
    assert int(out[0]) > 0


def test_descents_taking_turns_end_where_each_ends_alone(monkeypatch):
    """planner._descents with three descents going on at once, each line started on a pool (here
    one that evaluates a point when its answer is read, so the order is the test's, not the
    machine's) and read while the others' lines wait: each descent ends at the point, and with the
    figures, it reaches alone on a fresh evaluator, though the cache it shares holds the others'
    points, some cut short against their incumbents."""
    from digenrl.sim import planner
    from digenrl.sim.costs import default_cost_model

    class Lazy:  # apply_async's answer, evaluated when read
        def __init__(self, fn, args):
            self.fn, self.args, self.got = fn, args, None

        def ready(self):
            return self.got is not None

        def get(self):
            if self.got is None:
                self.got = self.fn(*self.args)
            return self.got

    class Pool:
        started = 0

        def apply_async(self, fn, args):
            self.started += 1
            return Lazy(fn, args)

    tb, cm = load_testbed(SMALL), default_cost_model()
    mode = "gap+tsp+tag"  # (3-step on-policy runs: cheap; its grid is digenrl's)
    axes = grid(tb, mode, None, cm)
    first = planner.default_point(tb, mode, axes, cm)
    mbs = axes["micro_batch_groups"]
    starts = [first] + [{**first, "micro_batch_groups": v} for v in (mbs[len(mbs) // 2], mbs[-1])]
    ev = planner._Evaluator(tb, mode, None, planner.PLAN_STEPS, cm)
    ev.pool = Pool()
    monkeypatch.setattr(planner, "_CTX", ev.ctx)
    monkeypatch.setattr(planner, "_JOBS", 3)
    together = planner._descents(ev, axes, starts)
    assert ev.pool.started > len(starts) and any(isinstance(r, planner._Pruned) for r in ev.cache.values())
    for s0, (p, r) in zip(starts, together):
        q, qr = planner._descend(planner._Evaluator(tb, mode, None, planner.PLAN_STEPS, cm), axes, s0)
        assert (p, r.step_s, r.throughput) == (q, qr.step_s, qr.throughput), s0


def _square_or_refuse(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative: {x}")
    return x * x


def _fresh_process(code: str, lines: int = 1):
    """Run `code` in a new Python process (one thread, as the CLI's: the planner forks its workers
    only there, sim/planner._fork_safe) and return its last line of output (lines > 1: its last
    `lines` lines)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-lines:]
    return last[0] if lines == 1 else last


def test_side_by_side_keeps_the_items_order_and_raises_what_a_task_raised():
    """simulate() plans its rows with it: the results come back in the items' order whichever
    process finished first, and a task's exception reaches the caller. In a fresh process (the
    pool forks there; in a process with other threads, such as a test worker, it runs serially)."""
    code = ("import os\n"
            "from digenrl.sim.planner import jobs, side_by_side\n"
            "from tests.sim.test_planner import _square_or_refuse, _pid\n"
            "with jobs(2):\n"
            "    assert side_by_side(_square_or_refuse, [5, 1, 4, 2, 3]) == [25, 1, 16, 4, 9]\n"
            "    assert os.getpid() not in side_by_side(_pid, [0, 1])  # in the pool's processes\n"
            "    try:\n"
            "        side_by_side(_square_or_refuse, [1, -2, 3])\n"
            "    except ValueError as e:\n"
            "        assert 'negative: -2' in str(e)\n"
            "    else:\n"
            "        raise AssertionError('no ValueError')\n"
            "assert side_by_side(_square_or_refuse, [3, 2]) == [9, 4]  # one process: in this one\n"
            "print('ok')\n")
    assert _fresh_process(code) == "ok"


def _pid(_) -> int:
    import os

    return os.getpid()


def test_the_planner_forks_only_a_process_without_other_threads():
    """A fork copies the calling thread alone: a lock another thread held stays held in the child
    (a test worker's Ray and wandb threads hung one). With another thread running, the search
    and side_by_side stay in this process; their processes end on SIGTERM whatever the parent's
    handler (a pool ends that way; after ray.init the handler is Ray's)."""
    import threading

    from digenrl.sim.planner import _fork_safe, jobs, side_by_side

    release = threading.Event()
    t = threading.Thread(target=release.wait)
    t.start()
    try:
        assert not _fork_safe()
        with jobs(2):
            assert side_by_side(_pid, [0, 1]) == [os.getpid()] * 2
    finally:
        release.set()
        t.join()
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: time.sleep(3600))  # never exits\n"
            "from digenrl.sim.planner import _fork_pool\n"
            "from tests.sim.test_planner import _sigterm_is_default\n"
            "with _fork_pool(2) as pool:\n"
            "    print(pool.map(_sigterm_is_default, range(2), chunksize=1))\n")
    assert _fresh_process(code) == "[True, True]"


def test_a_pool_process_has_the_default_sigterm_from_its_fork():
    """A pool ends its processes with SIGTERM, and may do so before a process that took no task
    ran the pool's initializer (a busy machine): that process must not have the parent's handler
    even then. The handler each process has at the moment of its fork is recorded by an at-fork
    hook, before any initializer can run (it read the parent's "never exits" handler when only
    the initializer reset it, and the pool's join then hung in CI)."""
    code = ("import os, signal, sys, tempfile, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: time.sleep(3600))  # never exits\n"
            "path = tempfile.mktemp()\n"
            "os.register_at_fork(after_in_child=lambda: open(path, 'a').write(\n"
            "    str(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL) + ' '))\n"
            "from digenrl.sim.planner import _fork_pool\n"
            "with _fork_pool(2) as pool:\n"
            "    pass  # ended at once: no process need have run anything\n"
            "assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL  # the parent's own is back\n"
            "print(open(path).read().split())\n")
    assert _fresh_process(code) == "['True', 'True']"


def _sigterm_is_default(_) -> bool:
    import signal

    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.slow
def test_simulate_on_two_processes_reports_what_one_process_does():
    """simulate() under jobs(2) plans its longest row with that search's lines side by side, then
    the other rows side by side: every row's plan and figures, and the rows that do not fit, are
    those of the serial run. (How many points a search simulated or pruned may differ: a line's
    points run side by side against the line's first incumbent, test above.)"""
    from digenrl.sim.simulate import simulate

    code = ("from digenrl.sim.planner import jobs\n"
            "from digenrl.sim.simulate import simulate\n"
            "from digenrl.sim.testbed import load_testbed\n"
            "from tests.sim.test_planner import SMALL, _simulate_figures\n"
            "with jobs(2):\n"
            "    print(_simulate_figures(simulate(load_testbed(SMALL))))\n")
    assert _fresh_process(code) == _simulate_figures(simulate(load_testbed(SMALL)))  # the pool forks in the fresh process


def _simulate_figures(rep) -> str:
    """A simulate() report's figures: each plan less the seconds it took and the points it
    simulated or pruned (the search's effort), the rows that do not fit, each row's spec and step time."""
    effort = ("wall_s", "evaluated", "pruned")
    return repr(({k: {f: v for f, v in p.items() if f not in effort} for k, p in rep.plans.items()}, rep.unfit,
                 {k: (r.spec, r.step_s) for k, r in rep.rows.items()}))

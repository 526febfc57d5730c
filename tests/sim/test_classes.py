"""Identical workers simulated once (run_virtual `classes`, Scheduler.complete_parked): the reduced
engine against the unreduced one (every fast path off) on seeded random pools and testbeds, with
losses, joins and spot notices: the same trace span for span, the same end, membership, events,
scheduler state and cost-model bookkeeping. The constant-cost pools (faults and notices included)
run in the default tier; the cost-model and spot runs (seconds) in the slow tier."""

import random

import pytest

from digenrl.sched import MODES, SchedConfig, Scheduler, Worker
from digenrl.sim.costs import default_cost_model
from digenrl.sim.engine import run_virtual
from digenrl.sim.report import spec_duration_fn
from digenrl.sched.preemption import engine_events
from digenrl.sim.spot import draw_run, spot_lines
from digenrl.sim.testbed import Testbed, load_testbed, resize
from digenrl.sim.workload import RunSpec
from tests.sched.sched_helpers import const_cost

UNREDUCED = dict(quiet_syncs=False, batched=False, classes=False)


class _Counting(Scheduler):
    """A Scheduler that counts the completions resolved as a class (one complete_parked call each
    run of them), so a test can tell the reduction was exercised."""

    parked = 0
    waved = 0  # units started in a wave (last_waves: the engine launches them at once)
    opt_waved = 0  # ... of them, OptimizerSteps (a barrier's parked trainers)

    def complete_parked(self, items, start=0):
        j = super().complete_parked(items, start)
        self.parked += j - start
        return j

    def assign(self):
        out = super().assign()
        for i, j in self.last_waves:
            kind = type(out[i][1]).__name__
            assert len({id(u) for _, u in out[i:j]}) == 1 and kind in ("WeightSync", "OptimizerStep")
            self.waved += j - i
            self.opt_waved += (j - i) * (kind == "OptimizerStep")
        return out


def _outcome(make, duration, **kw):
    """(trace figures, scheduler figures) of one run, or the error it ended with."""
    s = make()
    try:
        tr = run_virtual(s, duration, **kw)
    except (RuntimeError, ValueError) as e:
        return ("error", str(e)), s
    # and the scheduler's counts and idle classes, in their order (what the next assign() reads)
    state = (s.version, s.stats, s.describe(), s._n_syncing, s._n_at, s._opt_reported,
             [(r, [(v, list(p)) for v, p in d.items()]) for r, d in s._idle.items()])
    return (tr.spans, tr.end, tr.alive, tr.n_events, getattr(tr, "preemption", None), state), s


def _same(make, duration_of, **events):
    """Reduced and unreduced runs agree; returns how many completions were resolved as a class
    (and, with waves=True, how many units were launched as a sync wave)."""
    fast, s = _outcome(make, duration_of(), **events)
    ref, _ = _outcome(make, duration_of(), **UNREDUCED, **events)
    assert fast == ref
    return s.parked


def _random_pools(rng, mode):
    if mode == "colocated":
        ws = [Worker(f"c{i}", "colocated") for i in range(rng.randint(2, 12))]
    else:
        ws = [Worker(f"r{i}", "rollout") for i in range(rng.randint(1, 24))]
        ws += [Worker(f"t{i}", "trainer") for i in range(rng.randint(1, 12))]
    return ws + [Worker(f"w{i}", "reward") for i in range(rng.choice((0, 0, 1, 2)))]


def _random_events(rng, workers, horizon):
    """Losses of rollout / reward workers, replacements joining, notices (a drain, then a deadline)."""
    rollout = [w.id for w in workers if w.role == "rollout"]
    reward = [w.id for w in workers if w.role == "reward"]
    failures, joins, drains, deadlines = [], [], [], []
    hit = rng.sample(rollout, min(len(rollout), rng.randint(0, 3))) + rng.sample(reward, min(len(reward), 1))
    for j, wid in enumerate(hit):
        t = rng.uniform(0, horizon)
        if wid.startswith("r") and rng.random() < 0.5:  # a notice
            drains.append((t, wid))
            deadlines.append((t + rng.uniform(0, horizon / 4), wid))
        else:
            failures.append((t, wid))
        if wid.startswith("r") and rng.random() < 0.7:
            joins.append((t + rng.uniform(0, horizon / 4), Worker(f"{wid}+{j}", "rollout")))
    return dict(failures=failures, joins=joins, drains=drains, deadlines=deadlines)


def test_random_pools_constant_costs():
    """Constant costs end many units at once (the worst case for ties); random modes, knobs, pools
    and faults, 24 seeds."""
    parked = [_random_run(seed) for seed in range(24)]
    assert sum(p > 0 for p, _ in parked) >= 12  # the reduction acted in most of them
    assert sum(s.waved - s.opt_waved > 0 for _, s in parked) >= 12  # sync waves were launched at once
    assert sum(s.opt_waved > 0 for _, s in parked) >= 12  # and barrier waves


def _random_run(seed: int) -> tuple[int, "_Counting"]:
    rng = random.Random(seed)
    mode = rng.choice(MODES)
    cost = {"generate": rng.choice((0.5, 1.0)), "reward": 0.5, "train": rng.choice((0.5, 1.0, 2.0)),
            "optimizer": rng.choice((0.25, 0.5)), "sync": rng.choice((0.25, 0.5, 1.0))}
    cfg = SchedConfig(mode=mode, rl_steps=rng.randint(2, 4), groups_per_step=rng.choice((4, 6, 8, 12)),
                      micro_batch_groups=rng.choice((1, 2)), num_steps=rng.choice((4, 6)),
                      tsp_chunk=rng.choice((1, 2)), samples_per_group=4)
    workers = _random_pools(rng, mode)
    events = {} if mode == "colocated" or seed % 3 == 0 else _random_events(rng, workers, 30.0)
    made = []

    def make():
        made.append(_Counting(cfg, workers))
        return made[-1]
    return _same(make, lambda: const_cost(cost, cfg.samples_per_group), **events), made[0]


# Large idle pools on the cost model: most events are syncs and optimizer steps
SPECS = [
    ("small-h200x16-sd35", 64, RunSpec("digenrl", n_rollout=56, gen_shard=4, train_shard=4)),
    ("small-h200x16-sd35", 64, RunSpec("gap+tsp+tag", n_rollout=40, tag_segment=2)),
    ("h200x32-flux", 128, RunSpec("digenrl", n_rollout=96)),
    ("small-h200x16-sd35", 32, RunSpec("one-step-off", n_rollout=24, samples_per_group=1)),
    ("small-h200x16-sd35", 32, RunSpec("colocated", micro_batch_groups=2)),
]


@pytest.mark.slow
@pytest.mark.parametrize("preset,gpus,spec", SPECS)
def test_cost_model_runs(preset, gpus, spec):
    """The cost model's durations (one per device; its memo and per-worker state) and its
    bookkeeping (overhead seconds) are the same too."""
    tb = resize(load_testbed(preset), gpus)
    fns = []

    def duration_of():
        _, run, fn = spec_duration_fn(tb, spec, 4, default_cost_model())
        fns.append((run, fn))
        return fn

    made = []

    def make():
        made.append(_Counting(fns[-1][0].sched, fns[-1][1].layout.workers))
        return made[-1]
    parked = _same(make, duration_of)
    assert fns[0][1].overhead_ws == fns[1][1].overhead_ws
    assert fns[0][1]._units == fns[1][1]._units
    assert parked > 0 and made[0].opt_waved > 0
    assert made[0].waved > made[0].opt_waved or spec.mode == "colocated"  # (colocated: no syncs)


# Rollout workers on two device types: a wave's price is each worker's device's
TWO_DEVICES = {"name": "two-rollout-devices", "pools": [
    {"name": "trainers", "count": 4, "device": "H200", "role": "trainer"},
    {"name": "fast", "count": 4, "device": "H200", "role": "rollout"},
    {"name": "slow", "count": 8, "device": "L40S", "role": "rollout", "gpus_per_node": 8}],
    "model": "sd3.5-medium", "height": 512, "width": 512, "denoise_steps": 8, "trained_steps": 4,
    "group_size": 4, "groups_per_step": 4, "micro_batch": 2, "rollout_batch": 4}


def test_a_wave_is_priced_as_its_workers_one_by_one():
    """DurationFn.wave against a call per worker on a fresh DurationFn: the same seconds and the
    same memo and bookkeeping, for a wave on one device, across two devices, and with a worker
    the layout does not hold (a spot replacement, priced on its line's device)."""
    from digenrl.sched import WeightSync

    tb = Testbed.from_dict(TWO_DEVICES)
    spec = RunSpec("digenrl")
    for pick in (lambda ids: ids[4:], lambda ids: ids[2:7], lambda ids: ids[:3] + [ids[0] + "+1"] + ids[3:5]):
        fns = [spec_duration_fn(tb, spec, 4, default_cost_model())[2] for _ in range(2)]
        workers = {w.id: w for w in fns[0].layout.workers}
        wids = pick([w.id for w in fns[0].layout.workers if w.role == "rollout"])
        workers.update({wid: Worker(wid, "rollout") for wid in wids if wid not in workers})
        unit = WeightSync(1)
        for _ in range(2):  # priced first, then known
            assert fns[0].wave(workers, wids, unit) == [fns[1](workers[wid], unit) for wid in wids]
        assert fns[0].overhead_ws == fns[1].overhead_ws and fns[0]._units == fns[1]._units
    assert len(set(fns[0].wave(workers, [w.id for w in fns[0].layout.workers if w.role == "rollout"], unit))) == 2


def test_a_barrier_wave_is_priced_as_its_trainers_one_by_one():
    """The same for an OptimizerStep to trainer gangs under TAG: each trainer's own switch out of
    the helper (those that generated last), the unit's overhead replayed once per trainer."""
    from digenrl.sched import Generate, OptimizerStep, Train

    tb = resize(load_testbed("small-h200x16-sd35"), 32)
    spec = RunSpec("digenrl", n_rollout=8, gang=2)
    fns = [spec_duration_fn(tb, spec, 4, default_cost_model())[2] for _ in range(2)]
    workers = {w.id: w for w in fns[0].layout.workers}
    trainers = [w.id for w in fns[0].layout.workers if w.role == "trainer"]
    train = Train(0, 0, (0,), (0, 1), 0)
    gen = Generate(0, 0, (0,), 0, 0, 2)
    for fn in fns:  # every trainer trains; every third then generates (in the helper at the barrier)
        for i, wid in enumerate(trainers):
            fn(workers[wid], train)
            if i % 3 == 0:
                fn(workers[wid], gen)
    for step in range(2):
        unit = OptimizerStep(step, step + 1)
        if step == 0:
            fns[0](workers[trainers[0]], unit), fns[1](workers[trainers[0]], unit)  # priced: known after
        got = fns[0].wave(workers, trainers[1:], unit)
        assert got == [fns[1](workers[wid], unit) for wid in trainers[1:]]
        assert len(set(got)) == (2 if step == 0 else 1)  # (the helpers switched back at the first)
        assert fns[0].overhead_ws == fns[1].overhead_ws
        assert fns[0].tag_ledger.switches == fns[1].tag_ledger.switches > 0


# 4 H200 trainer gangs of 1, 16 L40S rollout workers on spot, reclaimed often
SPOT_TB = {"name": "spot-classes", "pools": [
    {"name": "trainers", "count": 4, "device": "H200", "role": "trainer"},
    {"name": "rollout", "count": 16, "device": "L40S", "role": "rollout", "gpus_per_node": 8,
     "spot": {"interruptions_per_hour": 400.0, "notice_s": 10.0, "replace_s": 15.0}}],
    "model": "sd3.5-medium", "height": 512, "width": 512, "denoise_steps": 8, "trained_steps": 4,
    "group_size": 4, "groups_per_step": 4, "micro_batch": 2, "rollout_batch": 4}


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_spot_notices(seed):
    """A spot rollout pool under the seeded preemption process (sim.spot's events: notices,
    deadlines, replacements joining), the cost model's durations."""
    tb = Testbed.from_dict(SPOT_TB)
    spec = RunSpec("digenrl")
    _, run, fn = spec_duration_fn(tb, spec, 6, default_cost_model())
    drains, deadlines, joins = engine_events(draw_run(spot_lines(fn.layout), 300.0, seed))
    assert drains
    by_id = {w.id: w for w in fn.layout.workers}

    def duration_of():
        _, _, f = spec_duration_fn(tb, spec, 6, default_cost_model())
        return lambda w, u: f(w if w.id in by_id else by_id[w.id.split("+")[0]], u)

    _same(lambda: _Counting(run.sched, fn.layout.workers), duration_of, drains=drains, deadlines=deadlines,
          joins=[(t, Worker(w, "rollout")) for t, w in joins])


def test_measure_weighs_a_run_of_spans_as_its_spans_one_by_one():
    """report.measure weighs a run of spans alike (one unit object, one start and end, workers of
    one weight) at once: the same figures, to the bit, as with every span apart (each span given
    its own copy of its unit, so that no two are one run)."""
    import copy
    from dataclasses import replace

    from digenrl.sim.report import measure

    for preset, gpus, spec in SPECS + [("small-h200x16-sd35", 1024, RunSpec("digenrl", n_rollout=992, gen_shard=4))]:
        tb = resize(load_testbed(preset), gpus)
        _, run, fn = spec_duration_fn(tb, spec, 6, default_cost_model())
        trace = run_virtual(Scheduler(run.sched, fn.layout.workers), fn)
        apart = replace(trace, spans=[replace(s, unit=copy.copy(s.unit)) for s in trace.spans])
        assert sum(a.unit is b.unit for a, b in zip(trace.spans, trace.spans[1:])) > len(trace.spans) // 10
        got, ref = measure(tb, spec, trace, fn, 6), measure(tb, spec, apart, fn, 6)
        assert (got.step_s, got.breakdown_s, got.bubble) == (ref.step_s, ref.breakdown_s, ref.bubble)

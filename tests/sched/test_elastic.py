"""Elastic pools: rollout workers join and drain mid-step; every (step, group, sample, t) is
trained exactly once, a drained worker takes no new work and leaves, and nothing is redone."""

import random
from collections import Counter

import pytest

from digenrl.sched import Generate, Scheduler, SchedConfig, SchedulerError, Worker
from digenrl.sched.units import rows

from .sched_helpers import COST, const_cost, done, pools
from digenrl.sim.engine import run_virtual

MODES = ("gap", "gap+tsp", "digenrl")


def expected(c: SchedConfig) -> Counter:
    return Counter((k, g, i, t) for k in range(c.rl_steps) for g in range(c.groups_per_step)
                   for i in range(c.samples_per_group) for t in c.trained(k))


def trained(trace, samples_per_group: int) -> Counter:
    """(step, group, sample, t) of every completed Train span; row r of a micro-batch is
    sample r % samples_per_group of its group r // samples_per_group."""
    out = Counter()
    for x in done(trace, "train"):
        u = x.unit
        a, b = rows(u, samples_per_group)
        for r in range(a, b):
            out.update((u.step, u.groups[r // samples_per_group], r % samples_per_group, t) for t in u.t_steps)
    return out


def elastic_run(mode, drains, joins=(), failures=(), n_rollout=3, n_trainer=2, **cfg):
    kw = dict(rl_steps=3, groups_per_step=12, micro_batch_groups=2, num_steps=6, tsp_chunk=2,
              samples_per_group=4)
    kw.update(cfg)
    c = SchedConfig(mode=mode, **kw)
    s = Scheduler(c, pools(mode, n_rollout, n_trainer))
    tr = run_virtual(s, const_cost(COST, c.samples_per_group), drains=drains, joins=joins, failures=failures)
    return s, tr


def in_flight_at(trace, wid, t):
    """The unit `wid` was running at time t (a completed span covering t), or None."""
    for x in done(trace, "generate") + done(trace, "reward") + done(trace, "sync"):
        if x.worker == wid and x.start <= t < x.end:
            return x.unit
    return None


def check_drained(s, tr, drains):
    """Drained workers left, and after the request ran only the rest of the trajectory they
    were generating (kept when nobody else could continue it), never a new unit."""
    gone = {w.id for w in s.workers}
    for t, wid in drains:
        assert wid not in gone
        leave = tr.alive[wid][1]
        assert leave is not None and leave >= t
        cur = in_flight_at(tr, wid, t)
        for x in tr.spans:
            if x.worker != wid or x.start < t or (x.start == t and x.unit == cur):
                continue
            assert x.end <= leave
            u = x.unit
            assert type(u) is Generate and type(cur) is Generate and u.t_start > 0, (wid, t, cur, u)
            assert (u.step, u.mb, u.samples, u.version) == (cur.step, cur.mb, cur.samples, cur.version)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("segment", [None, 1, 2])
@pytest.mark.parametrize("shard", [1, 2])
def test_adds_and_drains_mid_step_train_each_sample_once(mode, segment, shard):
    # trajectories take 6 s: every request lands mid-generation of a step
    joins = [(4.0, Worker("new0", "rollout")), (7.5, Worker("new1", "rollout"))]
    drains = [(1.3, "r0"), (9.1, "r1"), (17.3, "new0")]
    s, tr = elastic_run(mode, drains, joins, rollout_segment=segment, gen_shard=shard, train_shard=shard)
    assert s.done
    assert trained(tr, s.cfg.samples_per_group) == expected(s.cfg)
    check_drained(s, tr, drains)
    assert [w.id for w in s.workers if w.role == "rollout"] == ["r2", "new1"]
    assert s.draining == [] and s.pop_drained() == []  # the engine took them
    if shard == 1:
        assert s.stats["restarts"] == 0  # a drain never throws generated work away
    if segment is not None:  # r0 is mid-trajectory at 1.3 s with version 0 = current: handed over
        assert s.stats["drain_handovers"] >= 1
        g0 = in_flight_at(tr, "r0", 1.3)
        nxt = [x for x in done(tr, "generate") if x.unit.t_start == g0.t_end
               and (x.unit.step, x.unit.mb, x.unit.samples) == (g0.step, g0.mb, g0.samples)]
        assert len(nxt) == 1 and nxt[0].worker != "r0"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(6))
def test_random_adds_drains_and_losses(mode, seed):
    rng = random.Random(seed)
    n = 4
    joins = [(rng.uniform(0, 40), Worker(f"new{i}", "rollout")) for i in range(3)]
    # drain at most n - 1 of the first workers (one always stays), at random times
    drains = sorted((rng.uniform(0, 40), f"r{i}") for i in rng.sample(range(n), n - 1))
    failures = [(joins[0][0] + rng.uniform(0.1, 10), "new0")] if seed % 2 else []
    s, tr = elastic_run(mode, drains, joins, failures, n_rollout=n,
                        rollout_segment=rng.choice([None, 1, 2]), gen_shard=rng.choice([1, 2]))
    assert trained(tr, s.cfg.samples_per_group) == expected(s.cfg)
    check_drained(s, tr, [d for d in drains])


def test_old_version_kept_by_the_draining_worker():
    # digenrl (TCSS): a slow r0 generates a step-1 trajectory with version 0 while the
    # trainers publish version 1 and r1 syncs to it. Drained then, r0 is the only holder of
    # version 0: a hand-over would restart the trajectory from t=0 on a version-1 worker, so
    # r0 finishes it itself, then leaves.
    cfg = dict(rl_steps=3, groups_per_step=4, micro_batch_groups=1, num_steps=4, samples_per_group=2,
               rollout_segment=1)

    def slow_r0(worker, unit):
        return const_cost(COST, 2)(worker, unit) * (3.0 if worker.id == "r0" else 1.0)

    def run(drains):
        s = Scheduler(SchedConfig(mode="digenrl", tcss=True, **cfg), pools("digenrl", 2, 1))
        return s, run_virtual(s, slow_r0, drains=drains)

    _, tr = run([])
    v1 = min(x.end for x in done(tr, "optimizer") if x.unit.step == 0)
    r1_at_1 = min(x.end for x in done(tr, "sync") if x.worker == "r1" and x.unit.version == 1)
    seg = next(x for x in sorted(done(tr, "generate"), key=lambda x: x.start)
               if x.worker == "r0" and x.unit.version == 0 and x.start > max(v1, r1_at_1)
               and x.unit.t_end < 4)
    t = (seg.start + seg.end) / 2
    s, tr = run([(t, "r0")])
    assert s.stats["drain_handovers"] == 0 and s.stats["restarts"] == 0
    rest = [x for x in done(tr, "generate") if x.worker == "r0" and x.start >= seg.end]
    assert [x.unit.t_start for x in rest] == list(range(seg.unit.t_end, 4))
    assert all((x.unit.step, x.unit.mb, x.unit.version) == (seg.unit.step, seg.unit.mb, 0) for x in rest)
    assert tr.alive["r0"][1] == rest[-1].end  # no reward pool: its Reward went to another worker
    assert trained(tr, 2) == expected(s.cfg)


def test_idle_worker_leaves_at_once_and_gets_nothing():
    c = SchedConfig(mode="gap", rl_steps=1, groups_per_step=1, micro_batch_groups=1, num_steps=2)
    s = Scheduler(c, [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    busy = dict(s.assign())
    idle = ({"r0", "r1"} - set(busy)).pop()
    assert s.drain(idle) is True
    assert [w.id for w in s.pop_drained()] == [idle] and idle not in {w.id for w in s.workers}
    assert s.pop_drained() == []
    with pytest.raises(SchedulerError, match="unknown or removed"):
        s.drain(idle)


def test_refusals():
    c = SchedConfig(mode="gap", rl_steps=1)
    s = Scheduler(c, [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    s.assign()
    with pytest.raises(SchedulerError, match="optimizer state"):
        s.drain("t0")
    s.drain("r0")
    with pytest.raises(SchedulerError, match="last rollout worker"):
        s.drain("r1")  # r0 is draining: r1 is the last one that stays
    assert s.drain("r0") is False  # draining twice is a no-op


@pytest.mark.parametrize("mode", ["gap+tsp+tag", "digenrl"])
@pytest.mark.parametrize("segment", [None, 1])
@pytest.mark.parametrize("when", [2.5, 13.3])
def test_tag_may_drain_every_rollout_worker(mode, segment, when):
    # TAG: trainers generate, so the rollout pool may go to zero mid-run (under TCSS also
    # while the rollout workers generate the next step with the previous weights)
    drains = [(when, "r0"), (when + 0.5, "r1")]
    s, tr = elastic_run(mode, drains, n_rollout=2, rollout_segment=segment)
    assert s.done and not [w for w in s.workers if w.role == "rollout"]
    assert s.stats["restarts"] == 0  # nobody else holds their version: they finish, then leave
    assert trained(tr, s.cfg.samples_per_group) == expected(s.cfg)
    check_drained(s, tr, drains)


def test_draining_worker_lost():
    # the loss wins: its unit is re-queued as for any lost worker, and it is not reported as drained
    s, tr = elastic_run("gap", drains=[(2.5, "r0")], failures=[(3.0, "r0")], rollout_segment=None)
    assert trained(tr, s.cfg.samples_per_group) == expected(s.cfg)
    assert s.stats["requeued"] == 1 and "r0" not in {w.id for w in s.workers}


@pytest.mark.parametrize("mode", MODES)
def test_reward_workers_drain(mode):
    # two reward workers, both drained mid-run: Rewards then run on the generating workers
    c = SchedConfig(mode=mode, rl_steps=3, groups_per_step=12, micro_batch_groups=2, num_steps=6,
                    tsp_chunk=2, samples_per_group=4, rollout_segment=2)
    s = Scheduler(c, pools(mode, 3, 2, n_reward=2))
    tr = run_virtual(s, const_cost(COST, c.samples_per_group), drains=[(5.9, "w0"), (12.9, "w1")])
    assert trained(tr, c.samples_per_group) == expected(c)
    assert not [w for w in s.workers if w.role == "reward"]
    assert all(x.start < tr.alive[x.worker][1] for x in done(tr, "reward") if x.worker in ("w0", "w1"))
    late = [x for x in done(tr, "reward") if x.start > 13]
    assert late and all(x.worker not in ("w0", "w1") for x in late)

"""Scheduler events driven by hand: re-queue on loss, TAG hand-over, sync, determinism."""

import pytest

from digenrl.sched import (Generate, Reward, Scheduler, SchedConfig, SchedulerError, Train,
                           WeightSync, Worker)
from digenrl.sim.engine import run_virtual

from .sched_helpers import const_cost, pools, run


def by_worker(assignments):
    return {a.worker_id: a.unit for a in assignments}


def test_lost_rollout_restarts_from_zero_without_segments():
    s = Scheduler(SchedConfig(mode="gap", groups_per_step=2, num_steps=4),
                  [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    a = by_worker(s.assign())
    lost = a["r0"]
    assert isinstance(lost, Generate) and lost.t_start == 0
    s.worker_lost("r0")
    assert s.assign() == []  # r1 is busy; the micro-batch waits, nothing is lost
    s.complete("r1", a["r1"])
    s.assign()  # r1 scores its own micro-batch (no reward pool) ...
    s.complete("r1", Reward(0, a["r1"].mb, a["r1"].groups))
    again = by_worker(s.assign())
    assert again["r1"] == Generate(0, lost.mb, lost.groups, 0, 0, 4)  # ... then redoes r0's
    assert s.stats["requeued"] == 1


def test_lost_rollout_resumes_from_segment_boundary():
    s = Scheduler(SchedConfig(mode="gap", groups_per_step=1, num_steps=4, rollout_segment=2),
                  [Worker("r0", "rollout"), Worker("t0", "trainer")])
    (a,) = s.assign()
    s.complete("r0", a.unit)
    (b,) = s.assign()
    assert b.unit == Generate(0, 0, (0,), 0, 2, 4)  # pinned: the latent lives on r0
    s.worker_lost("r0")
    s.add_worker(Worker("r9", "rollout"))
    (c,) = s.assign()
    assert c.unit == WeightSync(0)  # a new worker has no weights yet
    s.complete("r9", c.unit)
    (d,) = s.assign()
    # from the known boundary t=2
    assert (d.worker_id, d.unit) == ("r9", Generate(0, 0, (0,), 0, 2, 4))


def test_tag_hand_over_to_rollout_same_version():
    cfg = SchedConfig(mode="gap+tsp+tag", groups_per_step=3, num_steps=4, tsp_chunk=3)
    s = Scheduler(cfg, [Worker("r0", "rollout"), Worker("t0", "trainer"), Worker("t1", "trainer")])
    a = by_worker(s.assign())
    assert a["r0"].t_end == 4 and a["t0"].t_end == 1 and a["t1"].t_end == 1  # TAG segments
    s.complete("r0", a["r0"])
    (r,) = s.assign()
    s.complete("r0", r.unit)  # micro-batch of r0 rewarded: its Train unit is ready
    g = a["t0"]
    s.complete("t0", g)  # t0 at a segment boundary with training ready: hands over
    b = by_worker(s.assign())
    assert isinstance(b["t0"], Train) and b["t0"].mb == a["r0"].mb
    assert b["r0"] == Generate(0, g.mb, g.groups, 0, 1, 4)  # t_start > 0, same version
    s.complete("t1", a["t1"])  # no training ready for t1: it keeps its own trajectory
    assert by_worker(s.assign())["t1"] == Generate(0, a["t1"].mb, a["t1"].groups, 0, 1, 2)
    assert s.stats["handovers"] == 1


def test_tag_hand_over_in_a_run():
    s, tr = run("gap+tsp+tag", n_rollout=2, n_trainer=2, groups_per_step=8, micro_batch_groups=1,
                cost={"generate": 1.0, "reward": 0.1, "train": 0.5, "optimizer": 0.5, "sync": 0.5})
    assert s.stats["handovers"] > 0
    cont = [x for x in tr.spans if x.kind == "generate" and x.unit.t_start > 0
            and tr.workers[x.worker] == "rollout"]
    assert cont and all(x.version == x.step for x in cont)


def test_rollout_never_switches_weights_mid_trajectory():
    cfg = SchedConfig(mode="digenrl", tcss=True, rl_steps=2, groups_per_step=2, num_steps=2,
                      rollout_segment=1)
    s = Scheduler(cfg, [Worker("r0", "rollout"), Worker("t0", "trainer")])
    # Drive until the optimizer step of step 0 lands while r0 is mid-trajectory of step 1.
    seen = []
    pending = s.assign()
    while not s.done:
        a = pending.pop(0)
        seen.append((a.worker_id, a.unit))
        s.complete(a.worker_id, a.unit)
        pending += s.assign()
    gens = [u for w, u in seen if w == "r0" and isinstance(u, Generate)]
    for u in gens:  # each (step, mb) chain has one version
        assert {x.version for x in gens if (x.step, x.mb) == (u.step, u.mb)} == {u.version}
    syncs = [i for i, (w, u) in enumerate(seen) if isinstance(u, WeightSync)]
    for i in syncs:  # a sync never sits between two segments of one trajectory
        prev = [u for w, u in seen[:i] if w == "r0" and isinstance(u, Generate)]
        assert not prev or prev[-1].t_end == 2


def test_bad_events_raise():
    s = Scheduler(SchedConfig(mode="gap"), pools("gap", 1, 1))
    (a, *_) = s.assign()
    with pytest.raises(SchedulerError, match="unknown"):
        s.complete("nobody", a.unit)
    with pytest.raises(SchedulerError, match="running"):
        s.complete(a.worker_id, Reward(5, 5, (5,)))
    with pytest.raises(SchedulerError, match="trainer"):
        Scheduler(SchedConfig(mode="gap"), [Worker("r0", "rollout")])
    with pytest.raises(SchedulerError, match="colocated"):
        Scheduler(SchedConfig(mode="colocated"), pools("gap", 1, 1))


@pytest.mark.parametrize("mode", ["digenrl", "one-step-off"])
def test_deterministic(mode):
    fail = [(7.0, "r1"), (20.0, "r0")]
    join = [(9.0, Worker("r5", "rollout"))]
    runs = [run(mode, failures=fail, joins=join, rollout_segment=2)[1] for _ in range(2)]
    key = [[(x.worker, x.start, x.end, x.unit) for x in tr.spans] for tr in runs]
    assert key[0] == key[1]


def test_deadlock_is_reported():
    s = Scheduler(SchedConfig(mode="gap"), pools("gap", 1, 1))
    with pytest.raises(RuntimeError, match="deadlock"):
        run_virtual(s, const_cost(), failures=[(0.5, "r0")])  # no rollout worker left


def test_stale_partial_with_no_holder_restarts_from_zero():
    # TCSS: r0 is mid-trajectory of step 1 with version 0 when it dies; r1 already
    # moved to version 1, so nobody can finish the version-0 latent: restart at t=0
    # with version 1 (still one version per trajectory, lag 0).
    cfg = SchedConfig(mode="digenrl", tcss=True, tag=False, rl_steps=2, groups_per_step=2, num_steps=2,
                      rollout_segment=1, trained_steps=(0,))
    s = Scheduler(cfg, [Worker("r0", "rollout"), Worker("r1", "rollout"),
                        Worker("t0", "trainer")])

    def finish(*wids):
        for w in wids:
            s.complete(w, s.in_flight[w])
        return by_worker(s.assign())

    s.assign()
    finish("r0", "r1")  # step 0, segment [0,1) -> pinned [1,2)
    finish("r0", "r1")  # -> pinned Rewards
    a = finish("r0", "r1")  # rewarded: t0 trains; r0, r1 start step 1 with version 0
    assert a["r0"].step == 1 and a["r0"].version == 0 and isinstance(a["t0"], Train)
    finish("r1")  # r1: step 1 segment [0,1) -> [1,2)
    finish("r1")  # -> its Reward
    finish("r1")  # -> idle at version 0 (step 1 has no fresh micro-batch left)
    finish("t0")  # first Train -> second Train
    finish("t0")  # second Train -> OptimizerStep
    finish("t0")  # -> version 1; idle r1 syncs eagerly
    assert s.version == 1 and s.in_flight["r1"] == WeightSync(1)
    b = finish("r0")  # r0 keeps version 0 for the rest of its trajectory
    assert b["r0"] == Generate(1, a["r0"].mb, a["r0"].groups, 0, 1, 2)
    s.worker_lost("r0")
    assert s.stats["restarts"] == 1 and (1, a["r0"].mb) not in s.traj_version
    c = finish("r1")
    assert c["r1"] == Generate(1, a["r0"].mb, a["r0"].groups, 1, 0, 1)
    assert s.traj_version[(1, a["r0"].mb)] == 1

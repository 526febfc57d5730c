"""Sample-axis shards (SchedConfig.gen_shard / train_shard): exactly-once per sample in every
mode, also with worker loss; one version per micro-batch; Reward waits for all shards."""

import random
from collections import Counter

import pytest

from digenrl.sched import MODES, Generate, Reward, Scheduler, SchedConfig, Train, Worker, kind
from digenrl.sched.units import n_samples, rows, split_rows
from digenrl.sim.engine import run_virtual

from .sched_helpers import DISAGG_MODES, const_cost, done, final_attempts, random_losses, run

GS = 3  # samples per group: shard boundaries fall inside groups


def expected(s):
    c = s.cfg
    return Counter((k, g, i, t) for k in range(c.rl_steps) for g in range(c.groups_per_step)
                   for i in range(c.samples_per_group) for t in c.trained(k))


def trained(trace, gs=GS):
    out = Counter()
    for x in done(trace, "train"):
        u = x.unit
        a, b = rows(u, gs)
        for r in range(a, b):
            for t in u.t_steps:
                out[(u.step, u.groups[r // gs], r % gs, t)] += 1
    return out


def check_generation(s, tr, gs=GS):
    """Final attempts: one version per micro-batch (= the Train units'), each shard's rows
    generated 0..num_steps once, the shards tile the micro-batch, and each shard (a
    generation fragment) is scored after it ended."""
    n = s.cfg.num_steps
    trains = {}
    for x in done(tr, "train"):
        trains.setdefault((x.step, x.unit.mb), set()).add(x.unit.traj_version)
    by_mb: dict = {}
    for key, segs in final_attempts(tr).items():
        u = segs[0].unit
        assert [(x.unit.t_start, x.unit.t_end) for x in segs][0][0] == 0 and segs[-1].unit.t_end == n
        assert all(a.unit.t_end == b.unit.t_start for a, b in zip(segs, segs[1:]))  # contiguous
        assert len({x.unit.samples for x in segs}) == 1
        by_mb.setdefault((u.step, u.mb), []).append(segs)
    assert set(by_mb) == set(trains)
    scored: dict = {}  # (step, mb) -> fragment rows -> its last Reward
    for x in sorted(done(tr, "reward"), key=lambda x: x.end):
        scored.setdefault((x.step, x.unit.mb), {})[rows(x.unit, gs)] = x
    for key, shards in by_mb.items():
        versions = {x.version for segs in shards for x in segs}
        assert len(versions) == 1 and versions == trains[key], key  # one version per micro-batch
        cover = sorted(rows(segs[0].unit, gs) for segs in shards)
        assert cover[0][0] == 0 and all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
        assert cover[-1][1] == len(shards[0][0].unit.groups) * gs
        assert set(scored[key]) == set(cover)  # every fragment scored
        for segs in shards:
            assert scored[key][rows(segs[0].unit, gs)].start >= segs[-1].end  # after it was generated
    return by_mb


def test_split_rows():
    assert split_rows(8, 1) == (None,)
    assert split_rows(7, 3) == ((0, 3), (3, 5), (5, 7))
    assert split_rows(2, 4) == ((0, 1), (1, 2))  # capped at one row per shard
    assert split_rows(1, 4) == (None,)
    g = Generate(0, 0, (4, 5), 0, 0, 3, (2, 5))
    assert rows(g, 3) == (2, 5) and n_samples(g, 3) == 3
    assert rows(Train(0, 0, (4, 5), (0,), 0), 3) == (0, 6)
    assert hash(g) == hash(Generate(0, 0, (4, 5), 0, 0, 3, (2, 5)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gen_shard,train_shard", [(2, 1), (1, 3), (4, 2)])
def test_exactly_once_per_sample(mode, gen_shard, train_shard):
    # 7 groups of 3 in micro-batches of 2: a ragged last micro-batch (3 rows), shards that
    # do not divide the rows and cut groups
    s, tr = run(mode, groups_per_step=7, micro_batch_groups=2, samples_per_group=GS,
                gen_shard=gen_shard, train_shard=train_shard, rollout_segment=2)
    assert s.done and trained(tr) == expected(s)
    by_mb = check_generation(s, tr)
    assert max(len(v) for v in by_mb.values()) == min(gen_shard, 2 * GS)
    assert {x.unit.samples for x in done(tr, "train")} == set(split_rows(6, train_shard)
                                                              + split_rows(3, train_shard))
    if gen_shard > 1:  # shards of one micro-batch ran at the same time on different workers
        spans = [x for x in done(tr, "generate") if x.unit.samples is not None]
        assert any(a.worker != b.worker and a.unit.mb == b.unit.mb and a.step == b.step
                   and a.start < b.end and b.start < a.end for a in spans for b in spans)


@pytest.mark.parametrize("mode", DISAGG_MODES)
@pytest.mark.parametrize("seed", range(4))
def test_exactly_once_per_sample_with_random_loss(mode, seed):
    rng = random.Random(seed)
    failures, joins = random_losses(rng)
    s, tr = run(mode, n_rollout=4, n_trainer=2, n_reward=2, failures=failures, joins=joins,
                rollout_segment=rng.choice([None, 1, 2]), rl_steps=3, samples_per_group=GS,
                gen_shard=rng.choice([2, 3]), train_shard=rng.choice([1, 2]))
    assert trained(tr) == expected(s)
    check_generation(s, tr)
    assert s.stats["requeued"] >= 1 and any(x.extra for x in tr.spans)


def test_lost_shard_keeps_the_micro_batch_version():
    s = Scheduler(SchedConfig(mode="gap", groups_per_step=1, samples_per_group=4, num_steps=4, gen_shard=2),
                  [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    a = {x.worker_id: x.unit for x in s.assign()}
    assert {a["r0"].samples, a["r1"].samples} == {(0, 2), (2, 4)}  # both shards start at once
    s.worker_lost("r1")
    assert s.assign() == []  # r0 is busy; the lost shard waits
    s.complete("r0", a["r0"])
    (c,) = s.assign()  # GAP: r0 scores its own fragment at once (its images are there)
    assert (c.worker_id, c.unit) == ("r0", Reward(0, 0, (0,), a["r0"].samples))
    s.complete("r0", c.unit)
    (d,) = s.assign()  # then redoes the lost fragment: the micro-batch's version, the same rows
    assert (d.worker_id, d.unit) == ("r0", Generate(0, 0, (0,), 0, 0, 4, a["r1"].samples))
    s.complete("r0", d.unit)
    (e,) = s.assign()
    assert (e.worker_id, e.unit) == ("r0", Reward(0, 0, (0,), a["r1"].samples))  # that fragment, once
    s.complete("r0", e.unit)
    trains = [x.unit for x in s.assign()]  # the group is assembled: its Train units exist now
    assert trains and all(type(u) is Train for u in trains)
    assert s.stats["restarts"] == 0 and s.stats["requeued"] == 1


def test_stranded_shard_restarts_the_whole_micro_batch():
    # digenrl: rollout workers generate step 1 with version 0 while step 0 trains. Both
    # holders of version 0 die mid-step-1; once version 1 is out, nobody can finish the
    # micro-batch with version 0, so all its shards restart with version 1.
    cfg = SchedConfig(mode="digenrl", tcss=True, rl_steps=2, groups_per_step=1, samples_per_group=4, num_steps=4,
                      gen_shard=2, tag=False)
    s = Scheduler(cfg, [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    tr = run_virtual(s, const_cost(samples_per_group=4), failures=[(4.2, "r0"), (4.3, "r1")],
                     joins=[(10.0, Worker("r2", "rollout"))])
    assert s.done and s.stats["restarts"] == 1
    lost = [x.unit for x in tr.spans if x.extra and x.extra.get("lost")]
    assert {(u.step, u.version) for u in lost} == {(1, 0)}
    final = [segs for key, segs in final_attempts(tr).items() if key[0] == 1]
    assert {x.version for segs in final for x in segs} == {1}
    assert {segs[0].unit.samples for segs in final} == {(0, 2), (2, 4)}
    check_generation(s, tr, 4)
    assert trained(tr, 4) == expected(s)


def test_train_shards_spread_the_tail_over_trainers():
    # one micro-batch, 4 trainers: unsharded, one trainer trains it; 4 shards, all four do
    for k, busy in ((1, 1), (4, 4)):
        s, tr = run("gap+tsp", n_rollout=1, n_trainer=4, groups_per_step=1, micro_batch_groups=1,
                    tsp_chunk=5, train_shard=k, rl_steps=1)
        assert len({x.worker for x in done(tr, "train")}) == busy


def test_unsharded_units_are_unchanged():
    s, tr = run("digenrl", rl_steps=2)
    assert all(x.unit.samples is None for x in done(tr, "generate") + done(tr, "train"))


@pytest.mark.parametrize("mode", ["colocated", "disagg-sync", "gap", "gap+tsp", "digenrl"])
def test_generation_fragments_are_scored_as_they_finish_and_assembled_out_of_order(mode):
    # GAP along the generation axis: one prompt group of 4 generations cut into 4 fragments on
    # 4 generators that finish in reverse order (the last rows first). Each fragment is scored
    # alone as soon as it is generated, before its slower siblings finish; nothing trains until
    # the group's last fragment is scored; every sample is scored and trained exactly once.
    def duration(worker, unit):
        k = kind(unit)
        if k == "generate":  # the fragment of rows [3, 4) is the quickest, [0, 1) the slowest
            return (4 - unit.samples[0]) * (unit.t_end - unit.t_start)
        return {"reward": 0.25, "train": 1.0, "optimizer": 0.5, "sync": 0.5}[k]

    workers = [Worker(f"c{i}", "colocated") for i in range(4)] if mode == "colocated" else \
        [Worker(f"r{i}", "rollout") for i in range(4)] + [Worker("t0", "trainer")]
    s = Scheduler(SchedConfig(mode=mode, rl_steps=2, groups_per_step=1, samples_per_group=4, num_steps=2,
                              gen_shard=4, tag=False), workers)
    tr = run_virtual(s, duration)
    for step in range(2):
        spans = [x for x in tr.spans if getattr(x.unit, "step", None) == step]
        gens = [x for x in spans if kind(x.unit) == "generate"]
        scored = [x for x in spans if kind(x.unit) == "reward"]
        trains = [x for x in spans if kind(x.unit) == "train"]
        assert sorted(x.unit.samples for x in scored) == [(0, 1), (1, 2), (2, 3), (3, 4)]  # each fragment once
        if step == 0:  # started together (under TCSS step 1's fragments start as workers free up)
            assert min(x.end for x in scored) < max(x.end for x in gens)  # scored before the last finished
            assert [x.unit.samples for x in sorted(scored, key=lambda x: x.start)] == [(3, 4), (2, 3), (1, 2), (0, 1)]
        assert min(x.start for x in trains) >= max(x.end for x in scored)  # assembled, then trained
    check_generation(s, tr, gs=4)

"""BTS (sched/bts.py): at a trainer's bubble, InsertTAG only where the predicted makespan of the
rest of the step is shorter; never slower than both TAG off and greedy TAG."""

from __future__ import annotations

import random

import pytest

from digenrl.sched import Scheduler, SchedConfig, Worker, kind
from digenrl.sched.bts import Profile, Rates, Search, decide
from digenrl.sim.engine import run_virtual


def test_prediction_by_hand():
    # one rollout worker, the deciding trainer alone, 4 micro-batches of 10 s, one 1 s Train unit
    # each, no switch cost. InsertTAG now: the trainer makes mb1 (0-10) beside the rollout's mb2
    # (0-10), trains both (10-12); rollout has started mb3 at 10 (ready 20); at its bubble at 12
    # the trainer makes mb4 (12-22) rather than wait for rollout to (20-30): trains mb3 22-23,
    # mb4 23-24. SkipBubble now: it waits for mb1 (10), trains it (10-11); at 11 it makes mb3
    # (11-21) beside the rollout's mb2 (10-20) and mb4 (20-30): 20-21, 21-22, 22-23 .. 30-31
    r = Rates(g_r=10.0, w_r=0.0, g_t=10.0, w_t=0.0, t=1.0, u=1)
    insert, skip_s, insert_s = decide(r, fresh=4, rollout=[0.0], trainers=[], ready=[], units=4)
    assert (insert, skip_s, insert_s) == (True, 31.0, 24.0)


def test_more_tag_is_not_always_better():
    # trainer-bound: 4 rollout workers make the 4 micro-batches at once, training (20 s a unit)
    # sets the pace; a trainer that generates first only adds its switch: skip
    r = Rates(g_r=10.0, w_r=0.0, g_t=10.0, w_t=0.0, t=20.0, u=1, s_in=1.0, s_out=1.0)
    insert, skip_s, insert_s = decide(r, fresh=4, rollout=[0.0] * 4, trainers=[], ready=[], units=4)
    assert not insert and skip_s == 90.0 and insert_s > skip_s
    # a trainer slower at generating than the rollout pool's round: skip as well
    slow = Rates(g_r=10.0, w_r=0.0, g_t=50.0, w_t=0.0, t=1.0, u=1)
    assert not decide(slow, fresh=4, rollout=[0.0, 0.0], trainers=[], ready=[], units=4)[0]


def test_search_is_memoised_and_depth_bounded():
    r = Rates(g_r=10.0, w_r=1.0, g_t=12.0, w_t=1.0, t=2.0, u=3, s_in=0.5, s_out=0.5)
    deep, shallow = Search(r, depth=3), Search(r, depth=0)
    state = (8, (0.0, 0.0), ((0.0, False), (0.0, False)), (), 24)
    a = deep.best(*state, depth=3)
    assert deep.best(*state, depth=3) == a and deep.memo  # the second ask is a memo hit
    # depth 0 = SkipBubble at every bubble (TAG off for the rest): the search can only do better
    assert a <= shallow.best(*state, depth=0)


def test_profile_learns_rates():
    p = Profile()
    assert p.rate("generate", "rollout") is None
    p.observe("generate", "rollout", 8, 4.0)
    p.observe("generate", "rollout", 2, 2.0)
    assert p.rate("generate", "rollout") == pytest.approx(0.6)  # 6 s over 10 units of work


def _run(mode, nr, nt, gen_t, train, groups, mbg):
    c = SchedConfig(mode=mode, rl_steps=3, groups_per_step=groups, micro_batch_groups=mbg, num_steps=6,
                    tsp_chunk=1, samples_per_group=4)
    s = Scheduler(c, [Worker(f"r{i}", "rollout") for i in range(nr)] + [Worker(f"t{i}", "trainer") for i in range(nt)])

    def duration(worker, unit):
        k = kind(unit)
        if k == "generate":  # trainers may be slower generators (another GPU, switches)
            return (gen_t if worker.role == "trainer" else 1.0) * (unit.t_end - unit.t_start) * len(unit.groups)
        if k == "train":
            return train * len(unit.t_steps) * len(unit.groups)
        return {"reward": 0.2, "optimizer": 0.5, "sync": 0.5}[k]
    return run_virtual(s, duration).end, s


def test_bts_is_never_slower_than_both_tag_off_and_greedy_tag():
    rng = random.Random(0)
    inserted = skipped = 0
    for _ in range(40):
        case = (rng.randint(1, 4), rng.randint(1, 4), rng.choice([1.0, 2.0, 5.0]), rng.choice([0.2, 1.0, 2.0]),
                rng.choice([4, 6, 8]), rng.choice([1, 2]))
        off = _run("gap+tsp", *case)[0]
        greedy = _run("gap+tsp+tag", *case)[0]
        bts, s = _run("digenrl", *case)
        assert bts <= max(off, greedy) + 1e-9, (case, off, greedy, bts)
        inserted += sum(d.insert for d in s.decisions)
        skipped += sum(not d.insert for d in s.decisions)
    assert inserted and skipped  # both choices taken somewhere


def test_greedy_tag_loses_and_bts_does_not():
    # 3 rollout workers, 3 trainers that generate 5x slower: greedy TAG takes micro-batches the
    # rollout pool would have finished sooner; BTS skips those bubbles once it has seen the rates
    case = (3, 3, 5.0, 0.2, 6, 1)
    off, greedy = _run("gap+tsp", *case)[0], _run("gap+tsp+tag", *case)[0]
    bts, s = _run("digenrl", *case)
    assert greedy > off * 1.05
    assert bts < greedy
    decided = [d for d in s.decisions if d.step > 0]  # after the first step the rates are known
    assert decided and not any(d.insert for d in decided)
    assert all(d.gain_s == 0.0 for d in decided)


def test_tag_handback_key_acts():
    # runtime.tag_handback reaches the scheduler; false: a trainer finishes its trajectory
    # rather than hand it back when training work appears (no mid-trajectory switch)
    from digenrl.config.contract import contract
    from digenrl.config.schema import load_config

    assert contract(load_config(None, ["runtime.tag_handback=false"])).sched.tag_handback is False
    # the scene of test_events.test_tag_hand_over_to_rollout_same_version: t0 at a segment
    # boundary with training ready hands over only when tag_handback is on
    from digenrl.sched import Generate, Train

    for back in (True, False):
        cfg = SchedConfig(mode="gap+tsp+tag", groups_per_step=3, num_steps=4, tsp_chunk=3, tag_handback=back)
        s = Scheduler(cfg, [Worker("r0", "rollout"), Worker("t0", "trainer"), Worker("t1", "trainer")])
        a = {x.worker_id: x.unit for x in s.assign()}
        s.complete("r0", a["r0"])
        (r,) = s.assign()
        s.complete("r0", r.unit)  # r0's micro-batch rewarded: its Train unit is ready
        s.complete("t0", a["t0"])
        b = {x.worker_id: x.unit for x in s.assign()}
        if back:
            assert isinstance(b["t0"], Train) and s.stats["handovers"] == 1
        else:  # t0 keeps generating its trajectory; the Train unit waits for a free trainer
            assert b["t0"] == Generate(0, a["t0"].mb, a["t0"].groups, 0, 1, 2) and s.stats["handovers"] == 0


def test_pairs_per_pass_key_refused_beside_backward_batch():
    from digenrl.config.schema import ConfigError, load_config

    assert load_config(None, ["train.pairs_per_pass=8"]).train.pairs_per_pass == 8
    with pytest.raises(ConfigError, match="train.pairs_per_pass"):
        load_config(None, ["train.pairs_per_pass=8", "train.backward_batch=2"])
    with pytest.raises(ConfigError, match="train.pairs_per_pass"):
        load_config(None, ["train.pairs_per_pass=-1"])

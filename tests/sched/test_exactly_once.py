"""Every (step, group, trained denoising step) is trained exactly once, in every mode,
also when rollout / reward workers die at random times and replacements join."""

import random
from collections import Counter

import pytest

from digenrl.sched import MODES, Generate, Reward, Scheduler, SchedConfig, SchedulerError, Train, Worker
from digenrl.sched.units import partition, split_rows

from .sched_helpers import DISAGG_MODES, done, random_losses, run


def expected(s):
    c = s.cfg
    return Counter((k, g, t) for k in range(c.rl_steps) for g in range(c.groups_per_step)
                   for t in c.trained(k))


def trained(trace):
    return Counter((x.step, g, t) for x in done(trace, "train") for g in x.unit.groups
                   for t in x.unit.t_steps)


@pytest.mark.parametrize("mode", MODES)
def test_exactly_once(mode):
    s, tr = run(mode, groups_per_step=7, micro_batch_groups=2)  # ragged last micro-batch
    assert trained(tr) == expected(s) and s.done


@pytest.mark.parametrize("mode", DISAGG_MODES)
@pytest.mark.parametrize("seed", range(4))
def test_exactly_once_with_random_loss(mode, seed):
    rng = random.Random(seed)
    failures, joins = random_losses(rng)
    s, tr = run(mode, n_rollout=4, n_trainer=2, n_reward=2, failures=failures, joins=joins,
                rollout_segment=rng.choice([None, 1, 2]), rl_steps=3)
    assert trained(tr) == expected(s)
    assert s.stats["requeued"] >= 1 and any(x.extra for x in tr.spans)  # r3 was busy


def test_colocated_and_trainer_loss_raise():
    for mode, wid in (("colocated", "c0"), ("digenrl", "t0")):
        s = Scheduler(SchedConfig(mode=mode), [Worker("c0", "colocated")] if mode == "colocated"
                      else [Worker("r0", "rollout"), Worker("t0", "trainer")])
        s.assign()
        with pytest.raises(SchedulerError, match="checkpoint"):
            s.worker_lost(wid)


def _drive_losing_inputs(s, rng, p_lost):
    """Run `s` completing a random in-flight unit at a time; a unit that reads trajectories
    (a continuation, Reward, Train) fails instead with probability p_lost (`inputs_lost`: its
    node died). Returns the Train units completed, and how many failed."""
    busy, trained, failed, rewarded = {}, [], 0, set()
    n_mbs = len(partition(s.cfg.groups_per_step, s.cfg.micro_batch_groups))
    while not s.done:
        new = dict(s.assign())
        # batch-level modes: a Train only once every micro-batch of its step has rewards (a
        # regenerated one's earlier rewards are the same: generation is deterministic)
        assert s.cfg.gap or all(sum(k == u.step for k, _ in rewarded) == n_mbs
                                for u in new.values() if type(u) is Train)
        busy.update(new)
        assert busy, s.describe()
        wid = rng.choice(sorted(busy))
        u = busy.pop(wid)
        reads = type(u) in (Reward, Train) or (type(u) is Generate and u.t_start > 0)
        if reads and rng.random() < p_lost:
            s.inputs_lost(wid, u)
            failed += 1
        elif s.complete(wid, u):
            if type(u) is Train:
                trained.append(u)
            elif type(u) is Reward:
                rewarded.add((u.step, u.mb))
    return trained, failed


@pytest.mark.parametrize("mode", DISAGG_MODES)
@pytest.mark.parametrize("seed", range(3))
def test_exactly_once_when_inputs_are_lost(mode, seed):
    # a lost node takes the trajectories it held: their readers fail, their micro-batches are
    # generated again, and units still running on them are dropped (Generate, Reward) or
    # kept (Train: it trained); sharded micro-batches and segments exercise the stale units
    rng = random.Random(seed)
    c = SchedConfig(mode=mode, rl_steps=3, groups_per_step=6, micro_batch_groups=2, num_steps=4,
                    tsp_chunk=2, rollout_segment=rng.choice([None, 2]), gen_shard=rng.choice([1, 2]),
                    train_shard=rng.choice([1, 2]))
    s = Scheduler(c, [Worker(f"r{i}", "rollout") for i in range(3)] + [Worker(f"t{i}", "trainer") for i in range(2)])
    units, failed = _drive_losing_inputs(s, rng, p_lost=0.25)
    assert failed >= 1 and s.stats["restarts"] >= 1
    # every (step, micro-batch, trained t, sample shard) trained exactly once
    got = Counter((u.step, u.mb, t, u.samples) for u in units for t in u.t_steps)
    mbs = partition(c.groups_per_step, c.micro_batch_groups)
    want = Counter((k, m, t, rows) for k in range(c.rl_steps) for m, groups in enumerate(mbs)
                   for t in c.trained(k) for rows in split_rows(len(groups) * c.samples_per_group, c.train_shard))
    assert got == want

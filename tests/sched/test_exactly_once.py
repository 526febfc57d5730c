"""Every (step, group, trained denoising step) is trained exactly once, in every mode,
also when rollout / reward workers die at random times and replacements join."""

import random
from collections import Counter

import pytest

from digenrl.sched import MODES, Scheduler, SchedConfig, SchedulerError, Worker

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

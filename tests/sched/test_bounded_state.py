"""Nothing the scheduler keeps grows with the run's length: a run of many RL steps (a month of
them on a real cluster) leaves it holding what a short one does. Checked on every container
the Scheduler holds (and one level inside: the idle pools per version), after 4 and after 16
RL steps of a digenrl run with workers lost and joining."""

import random
from collections import deque

from digenrl.sched import Scheduler, SchedConfig
from digenrl.sim.engine import run_virtual

from .sched_helpers import const_cost, pools, random_losses

CONTAINERS = (dict, list, set, deque)


def _sizes(s: Scheduler) -> dict[str, int]:
    out = {}
    for name, v in vars(s).items():
        if isinstance(v, CONTAINERS):
            inner = v.values() if isinstance(v, dict) else v
            out[name] = len(v) + sum(len(x) for x in inner if isinstance(x, CONTAINERS))
    return out


def _after(rl_steps: int) -> dict[str, int]:
    failures, joins = random_losses(random.Random(5))
    c = SchedConfig(mode="digenrl", rl_steps=rl_steps, groups_per_step=8, micro_batch_groups=2, num_steps=6,
                    rollout_segment=2, tsp_chunk=2)
    s = Scheduler(c, pools("digenrl", n_rollout=4, n_trainer=2, n_reward=2))
    run_virtual(s, const_cost(), failures=failures, joins=joins)
    return _sizes(s)


def test_scheduler_state_does_not_grow_with_the_run():
    short, long = _after(4), _after(16)
    assert "traj_version" in short and "_n_at" in short  # the two that once grew per step
    grew = {k: (short[k], long[k]) for k in short if long[k] > short[k]}
    assert not grew, f"containers that grow with the run's length (4 steps, 24 steps): {grew}"

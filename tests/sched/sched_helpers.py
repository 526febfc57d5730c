"""Shared helpers for the scheduler tests: pools, a constant cost model, trace checks."""

from __future__ import annotations

from digenrl.sched import Scheduler, SchedConfig, Worker, kind
from digenrl.sim.engine import run_virtual

DISAGG_MODES = ("disagg-sync", "one-step-off", "gap", "gap+tsp", "gap+tsp+tag", "digenrl")
ON_POLICY = ("colocated", "disagg-sync", "gap", "gap+tsp", "gap+tsp+tag")

# Seconds: per denoising step per micro-batch, per Reward, per trained step per group, ...
COST = {"generate": 1.0, "reward": 0.5, "train": 1.0, "optimizer": 0.5, "sync": 0.5}


def pools(mode: str, n_rollout: int = 3, n_trainer: int = 3, n_reward: int = 0) -> list[Worker]:
    if mode == "colocated":
        ws = [Worker(f"c{i}", "colocated") for i in range(n_rollout + n_trainer)]
    else:
        ws = [Worker(f"r{i}", "rollout") for i in range(n_rollout)]
        ws += [Worker(f"t{i}", "trainer") for i in range(n_trainer)]
    return ws + [Worker(f"w{i}", "reward") for i in range(n_reward)]


def const_cost(cost: dict = COST, samples_per_group: int = 8):
    """Generate scales with denoising steps, Train with (trained steps x groups); a sample
    shard (unit.samples) costs its share of the micro-batch's rows."""
    def duration(worker, unit):
        k = kind(unit)
        share = 1.0
        if getattr(unit, "samples", None) is not None:
            share = (unit.samples[1] - unit.samples[0]) / (len(unit.groups) * samples_per_group)
        if k == "generate":
            return cost[k] * (unit.t_end - unit.t_start) * share
        if k == "train":
            return cost[k] * len(unit.t_steps) * len(unit.groups) * share
        return cost[k]
    return duration


def run(mode: str, n_rollout=3, n_trainer=3, n_reward=0, cost=COST, failures=(), joins=(), **cfg):
    kw = dict(rl_steps=3, groups_per_step=12, micro_batch_groups=2, num_steps=6, tsp_chunk=2)
    kw.update(cfg)
    c = SchedConfig(mode=mode, **kw)
    s = Scheduler(c, pools(mode, n_rollout, n_trainer, n_reward))
    return s, run_virtual(s, const_cost(cost, c.samples_per_group), failures=failures, joins=joins)


def random_losses(rng) -> tuple[list, list]:
    """(failures, joins) for pools r0-r3 + w0-w1: r3 dies mid-generation, two more rollout
    workers and one of two reward workers at random times; each lost rollout worker is
    replaced a little later. Segments exercise restarts from a boundary, stale versions
    restarts from t=0."""
    lost = rng.sample(["r0", "r1", "r2"], 2) + [f"w{rng.randrange(2)}"]
    failures = [(0.5, "r3")] + [(rng.uniform(0, 60), w) for w in lost]
    joins = [(t + rng.uniform(0, 10), Worker(f"new{i}", "rollout"))
             for i, (t, w) in enumerate(failures) if w.startswith("r")]
    return failures, joins


def done(trace, kind_: str):
    """Completed (not lost) spans of one kind."""
    return [s for s in trace.spans if s.kind == kind_ and not (s.extra and s.extra.get("lost"))]


def final_attempts(trace) -> dict:
    """(step, mb) -> Generate spans of the attempt that finished (after the last t=0 start);
    for a sharded micro-batch the key is (step, mb, samples), one entry per shard."""
    by_mb: dict = {}
    for s in sorted(done(trace, "generate"), key=lambda s: (s.start, s.end)):
        u = s.unit
        key = (u.step, u.mb) if u.samples is None else (u.step, u.mb, u.samples)
        if u.t_start == 0:
            by_mb[key] = []
        by_mb.setdefault(key, []).append(s)
    return by_mb

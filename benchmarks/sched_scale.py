"""Scheduler + virtual clock at cluster scale: 2,048 rollout + 2,048 trainer workers.

    python benchmarks/sched_scale.py [--mode digenrl] [--steps 100] [--record]
                                     [--gen-shard K] [--train-shard K]

Constant costs; by default one micro-batch of one group per rollout worker per step,
three TSP chunks (of 9 trained steps) per micro-batch. Prints wall seconds and events/s
(target: < 60 s on one core).
"""

from __future__ import annotations

import argparse
import time

from digenrl.sched import Scheduler, SchedConfig, Worker, kind
from digenrl.sim.engine import run_virtual

# Seconds: generate and train per denoising step (training ~ 2x a forward), the rest per unit.
COST = {"generate": 1.0, "reward": 0.5, "train": 2.0, "optimizer": 1.0, "sync": 2.0}
GROUP_SIZE = 8


def duration(worker, unit):
    k = kind(unit)
    share = 1.0
    if k in ("generate", "train") and unit.samples is not None:  # a shard: its share of rows
        share = (unit.samples[1] - unit.samples[0]) / (len(unit.groups) * GROUP_SIZE)
    if k == "generate":
        return COST[k] * (unit.t_end - unit.t_start) * share
    if k == "train":
        return COST[k] * len(unit.t_steps) * share
    return COST[k]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="digenrl")
    p.add_argument("--rollout", type=int, default=2048)
    p.add_argument("--trainer", type=int, default=2048)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--groups", type=int, default=None,
                   help="groups per step (default: one per rollout worker; more makes TAG work)")
    p.add_argument("--record", action="store_true", help="keep the full trace (memory heavy)")
    p.add_argument("--gen-shard", type=int, default=1, help="Generate sample shards per micro-batch")
    p.add_argument("--train-shard", type=int, default=1, help="Train sample shards per unit")
    a = p.parse_args()
    cfg = SchedConfig(mode=a.mode, rl_steps=a.steps, groups_per_step=a.groups or a.rollout,
                      samples_per_group=GROUP_SIZE, micro_batch_groups=1, num_steps=10, tsp_chunk=3,
                      tag_segment=2, gen_shard=a.gen_shard, train_shard=a.train_shard)
    workers = [Worker(f"r{i}", "rollout") for i in range(a.rollout)]
    workers += [Worker(f"t{i}", "trainer") for i in range(a.trainer)]
    if a.mode == "colocated":
        workers = [Worker(f"c{i}", "colocated") for i in range(a.rollout + a.trainer)]
    t0 = time.perf_counter()
    s = Scheduler(cfg, workers)
    tr = run_virtual(s, duration, record=a.record)
    wall = time.perf_counter() - t0
    print(f"mode={a.mode} workers={len(workers)} rl_steps={a.steps} events={tr.n_events} "
          f"virtual_s={tr.end:.1f} wall_s={wall:.2f} events_per_s={tr.n_events / wall:,.0f} "
          f"handovers={s.stats['handovers']}")


if __name__ == "__main__":
    main()

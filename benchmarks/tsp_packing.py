"""TSP's batched replay on this CPU: the per-timestep loop against packed passes, side by side.

One RL step's training (Learner.accumulate over every micro-batch, then the optimizer step) is
timed both ways, alternating, `--reps` times each; each rep prints, the medians close the table:

  toy DiT   the default run's policy (tiny DiT 32x32, LoRA 16) on one process: 32 samples in
            micro-batches of 8, with the default window (first 2 steps) and Flow-GRPO's
            all-but-last (9 of 10 steps)
  SD3 gang  a tiny SD3.5 pipeline (tests/models/tiny_diffusers.build_sd3, CFG 4.5) under an
            FSDP gang of 2 gloo processes: 8 samples, 3 of 4 steps trained, each rank 4 rows;
            FSDP all-gathers and reduce-scatters counted per RL step (learner.comm)

Packed: `train.pairs_per_pass` = a micro-batch's rows x trained steps (one pass per unit).

    PYTHONPATH=. python benchmarks/tsp_packing.py [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.rollout import SampleSpec, generate


def _toy_batches(spec: SampleSpec, n_mb: int = 4, rows: int = 8):
    from digenrl.models.lora import LoraSpec, apply_lora
    from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiTPolicy
    from digenrl.models.tiny_dit_weights import load_base

    policy = TinyDiTPolicy(load_base())
    policy.module.requires_grad_(False)
    apply_lora(policy.module, LoraSpec(16, 16.0, LORA_TARGETS))
    prompts = ["two red circles on the left", "a blue square", "three green bars", "a yellow triangle"]
    batches = []
    for mb in range(n_mb):
        coords = [(0, mb * 2 + r // 4, r % 4) for r in range(rows)]
        traj = generate(policy, [prompts[(mb + r // 4) % 4] for r in range(rows)], coords, spec, step=0, version=0)
        traj.advantages = torch.randn(rows, generator=torch.Generator().manual_seed(mb))
        batches.append(traj)
    return policy, batches


def _time_step(policy, batches, spec, slots, pairs: int) -> float:
    learner = Learner(policy, LearnerConfig(lr=1e-4, pairs_per_pass=pairs))
    total = sum(len(b) for b in batches)
    t0 = time.perf_counter()
    for traj in batches:
        learner.accumulate(traj, slots, spec, total_samples=total, total_steps=len(slots))
    learner.zero_grad()  # the same weights for every rep
    return time.perf_counter() - t0


def toy(reps: int) -> list[tuple]:
    torch.set_num_threads(1)
    rows = []
    for label, sde_steps in (("toy DiT, window first 2", (0, 1)), ("toy DiT, all-but-last 9", tuple(range(9)))):
        spec = SampleSpec(sigmas=sigma_schedule(10, 1.0), sde_steps=sde_steps, seed=1)
        policy, batches = _toy_batches(spec)
        times = {0: [], 8 * len(sde_steps): []}
        for rep in range(reps):
            for pairs in (times if rep % 2 == 0 else reversed(list(times))):
                times[pairs].append(_time_step(policy, batches, spec, list(sde_steps), pairs))
        a, b = (statistics.median(v) for v in times.values())
        print(f"{label}: per-timestep {[round(x, 3) for x in times[0]]} s, "
              f"packed {[round(x, 3) for x in list(times.values())[1]]} s")
        rows.append((label, a, b, 4 * len(sde_steps), 4, None, None))
    return rows


def _gang_worker(rank: int, tmp: str, reps: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner.comm import CommCounter, count_fsdp
    from digenrl.learner.sharded import shard_policy
    from digenrl.models.diffusers_adapters import load_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=2)
    try:
        spec, traj = torch.load(f"{tmp}/batch.pt", weights_only=False)
        policy = load_policy("sd3", f"{tmp}/sd3", prompt_cache_dir=f"{tmp}/cache", height=16, width=16,
                             max_sequence_length=8, train="lora", lora_rank=4)
        shard_policy(policy, init_device_mesh("cpu", (2,)))
        counter = CommCounter()
        count_fsdp(policy.module, counter)
        slots = [0, 1, 2]
        out = {0: [], 12: []}
        comm = {}
        for rep in range(reps):
            for pairs in (out if rep % 2 == 0 else reversed(list(out))):
                learner = Learner(policy, LearnerConfig(pairs_per_pass=pairs))
                dist.barrier()
                t0 = time.perf_counter()
                learner.accumulate(traj, slots, spec, total_samples=8, total_steps=3, rows=slice(rank * 4, rank * 4 + 4))
                learner.zero_grad()
                out[pairs].append(time.perf_counter() - t0)
                comm[pairs] = counter.take()
        if rank == 0:
            torch.save({"times": out, "comm": comm}, f"{tmp}/gang.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


def gang(reps: int) -> list[tuple]:
    from digenrl.models.diffusers_adapters import load_policy
    from tests.models.tiny_diffusers import build_sd3

    with tempfile.TemporaryDirectory() as tmp:
        build_sd3(Path(tmp) / "sd3")
        policy = load_policy("sd3", f"{tmp}/sd3", prompt_cache_dir=f"{tmp}/cache", height=16, width=16,
                             max_sequence_length=8, train="lora", lora_rank=4)
        spec = SampleSpec(sigmas=sigma_schedule(4, 3.0), sde_steps=(0, 1, 2), cfg_scale=4.5, seed=2)
        coords = [(0, r // 4, r % 4) for r in range(8)]
        traj = generate(policy, ["a red cat"] * 4 + ["a dog"] * 4, coords, spec, step=0, version=0)
        traj.advantages = torch.randn(8, generator=torch.Generator().manual_seed(0))
        torch.save((spec, traj), f"{tmp}/batch.pt")
        mp.spawn(_gang_worker, args=(tmp, reps), nprocs=2, join=True)
        got = torch.load(f"{tmp}/gang.pt", weights_only=False)
    t, c = got["times"], got["comm"]
    print(f"SD3 gang of 2: per-timestep {[round(x, 3) for x in t[0]]} s, packed {[round(x, 3) for x in t[12]]} s")
    calls = lambda p, k: c[p].get(f"comm/train/{k}_calls", 0)  # noqa: E731 (one rank's calls)
    return [("tiny SD3 (CFG), FSDP gang of 2", statistics.median(t[0]), statistics.median(t[12]), 3, 1,
             (calls(0, "all_gather"), calls(12, "all_gather")), (calls(0, "reduce_scatter"), calls(12, "reduce_scatter")))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rows = toy(args.reps) + gang(args.reps)
    print(f"\nmedians of {args.reps} reps each, alternating order; one RL step's training")
    print("| setting | per-timestep s | packed s | speedup | passes per RL step | "
          "all-gathers per step (rank 0) | reduce-scatters per step (rank 0) |")
    print("|---|---|---|---|---|---|---|")
    for label, a, b, p0, p1, ag, rs in rows:
        ag_s = f"{ag[0]} -> {ag[1]}" if ag else "-"
        rs_s = f"{rs[0]} -> {rs[1]}" if rs else "-"
        print(f"| {label} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {p0} -> {p1} | {ag_s} | {rs_s} |")


if __name__ == "__main__":
    main()

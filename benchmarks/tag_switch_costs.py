"""TAG switch costs the runtime counts on this CPU beside what the simulator charges for the
same run (issue 38: "the switch costs the runtime counted on this CPU (bytes moved, seconds)
beside what the simulator charges for the same run").

Runs a tiny `digenrl train` through Ray (RAY_ADDRESS=local; the default tiny DiT, LoRA 16 unless
overridden) in run.mode=gap+tsp+tag with one trainer and no rollout pool, so that the trainer
generates every micro-batch and the schedule does not depend on timing: per RL step it generates
micro-batch 0 (nothing accumulated: a switch that moves nothing), trains it, then generates
micro-batch 1 holding that gradient, which runtime.trainer.tag_offload=always offloads and
restores. It reads the run's tag/* from metrics.jsonl. Then the simulator's side: the same
config's contract and scheduler on the virtual clock, its trainer's units through
sim/tag_switch.SwitchLedger (the accounting sim/durations.py charges with), one switch moving
sim/tag_switch.switch_bytes of the policy's own sizes (no AdamW state before the first optimizer
step). Prints both, totals over the run, and the runtime's seconds beside the simulator's
charge for those bytes at --pcie-gbps (the simulator prices GPU runs: its H2D/D2H rate).

    RAY_ADDRESS=local PYTHONPATH=. python benchmarks/tag_switch_costs.py [--segment 4] [key=value ...]

--segment: runtime.tag_segment (denoising steps per Generate unit; 4 = whole trajectories).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from digenrl.config.contract import contract
from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.math.grad_sum import grad_sum_bytes
from digenrl.runtime.tag_switch import METRICS
from digenrl.sched import Scheduler
from digenrl.sim.engine import run_virtual
from digenrl.sim.tag_switch import SwitchLedger, reload_bytes, switch_bytes

KEYS = ("tag/switches", "tag/offloads", "tag/offload_bytes", "tag/reload_bytes")
BASE = ["run.mode=gap+tsp+tag", "runtime.rollout.workers=0", "runtime.trainer.workers=1",
        "runtime.trainer.tag_offload=always", "train.steps=2", "data.groups_per_step=2", "data.micro_batch_groups=1",
        "data.group_size=2", "data.eval_max_prompts=1", "sampling.num_steps=4", "sampling.eval_num_steps=2"]


def overrides(segment: int, extra: list[str]) -> list[str]:
    return BASE + [f"runtime.tag_segment={segment}", *extra]


def counted(cfg) -> tuple[dict, float]:
    """Run `cfg` through Ray; (tag/* summed over its RL steps, wall seconds)."""
    from digenrl.runtime.driver import RayDriver

    t0 = time.perf_counter()
    RayDriver(cfg, progress=False).train()
    wall = time.perf_counter() - t0
    rows = [r for r in read_metrics(cfg.run.run_dir) if "tag/switches" in r]
    return {k: sum(r[k] for r in rows) for k in METRICS}, wall


def simulated(cfg) -> SwitchLedger:
    """The simulator's accounting of `cfg`'s switches: its scheduler on the virtual clock, the
    trainers' units through SwitchLedger, bytes from the policy's own sizes."""
    import torch

    from digenrl.learner import Learner, LearnerConfig
    from digenrl.models import build_policy

    torch.manual_seed(0)
    learner = Learner(build_policy(cfg.model, progress=False), LearnerConfig(lr=cfg.train.lr))
    trainable = sum(p.numel() for p in learner.params)
    master = learner.params[0].element_size()
    full_ft = cfg.model.lora_rank == 0

    def moved(step: int) -> int:  # AdamW state (and its `step` scalars, on a CPU) once a step was taken
        after = step > 0
        return switch_bytes(trainable=trainable, master_bytes=master, optimizer_elements=2 * trainable if after else 0,
                            grad_sum_bytes=grad_sum_bytes(cfg.train.grad_sum, trainable), full_ft=full_ft,
                            optimizer_steps=len(learner.params) if after else 0)

    ledger = SwitchLedger(moved, reload_bytes(trainable=trainable, generation_bytes=master, full_ft=full_ft))
    run = contract(cfg)

    def duration(worker, unit) -> float:
        if worker.role == "trainer":
            ledger.unit(worker.id, unit)
        return 1.0
    run_virtual(Scheduler(run.sched, run.workers()), duration)
    return ledger


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segment", type=int, default=4)
    ap.add_argument("--pcie-gbps", type=float, default=25.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"run.run_dir={tmp}/run", *overrides(args.segment, args.overrides)])
        run, wall = counted(cfg)
    sim = simulated(cfg)
    sim_row = {"tag/switches": sim.switches, "tag/offloads": sim.offloads, "tag/offload_bytes": sim.offload_bytes,
               "tag/reload_bytes": sim.reload_bytes}
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; run {wall:.0f} s wall; "
          f"tag_segment {args.segment}, {cfg.train.steps} RL steps, lora_rank {cfg.model.lora_rank}")
    print(f"{'':18s} {'runtime (counted)':>18s} {'simulator':>12s}")
    for k in KEYS:
        print(f"{k:18s} {run[k]:18,d} {sim_row[k]:12,d}")
    moved = sim.offload_bytes + sim.reload_bytes
    print(f"{'tag/switch_s':18s} {run['tag/switch_s']:18.4f} {moved / (args.pcie_gbps * 1e9):12.6f}  "
          f"(simulator: its bytes at {args.pcie_gbps:g} GB/s, without the mode toggles it adds per switch)")


if __name__ == "__main__":
    main()

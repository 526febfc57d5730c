"""What one TAG switch costs on this machine: bytes moved and seconds, offload + restore.

The default run's policy (tiny DiT 32x32; LoRA 16, and a full fine-tune) in one process: one
Train unit accumulated after an optimizer step (so AdamW state exists), then `--reps` switches
around an empty generation (TagSwitch.helper with tag_offload=always). Each prints its bytes
(out + back, = 2 x digenrl.sim.tag_switch.switch_bytes), the median seconds and the rate; the
restore is checked bit for bit against a copy taken before (the same check as
tests/runtime/test_tag_switch.py). A Ray run reports the same counters per RL step (tag/*).

    PYTHONPATH=. python benchmarks/tag_switch.py [--reps 20]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from digenrl.config.schema import load_config
from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.math.grad_sum import grad_sum_bytes
from digenrl.models import build_policy
from digenrl.rollout import SampleSpec, advance, start
from digenrl.runtime.tag_switch import TagSwitch
from digenrl.sim.tag_switch import switch_bytes


def state(learner) -> list[torch.Tensor]:
    opt = [v for p in learner.params for v in learner.optimizer.state[p].values()]
    return [p.detach() for p in learner.params] + [p.grad for p in learner.params] + \
        [s for s in learner.grads.sums if s is not None] + opt


def bench(lora_rank: int, reps: int) -> None:
    cfg = load_config(None, [f"model.lora_rank={lora_rank}"])
    policy = build_policy(cfg.model, progress=False)
    learner = Learner(policy, LearnerConfig(lr=1e-4))
    spec = SampleSpec(sigmas=sigma_schedule(4, 3.0), sde_steps=(0, 1), seed=0)
    with torch.no_grad():
        traj = advance(policy, start(policy, ["a red circle"] * 2, [(0, 0, 0), (0, 0, 1)], spec, step=0, version=0), spec)
    traj.advantages = torch.tensor([1.0, -1.0])
    for version in (1, None):  # a step (AdamW state), then a unit of the next step's gradient
        learner.accumulate(traj, [0, 1], spec, total_samples=2, total_steps=2)
        if version:
            learner.optimizer_step(version=version)
    before = [t.clone() for t in state(learner)]
    switch = TagSwitch(learner, "always")
    seconds = []
    for _ in range(reps):
        with switch.helper():
            pass
        seconds.append(switch.take()["tag/switch_s"])
    assert all(torch.equal(a, b) for a, b in zip(before, state(learner))), "restore not bit-exact"
    trainable = sum(p.numel() for p in learner.params)
    one_way = switch_bytes(trainable=trainable, master_bytes=learner.params[0].element_size(),
                           optimizer_elements=2 * trainable, grad_sum_bytes=grad_sum_bytes("auto", trainable),
                           full_ft=lora_rank == 0, optimizer_steps=len(learner.params))
    med = statistics.median(seconds)
    name = f"LoRA {lora_rank}" if lora_rank else "full FT"
    print(f"{name:8s} trainable {trainable:>9,d} in {len(learner.params):3d} tensors  moved {2 * one_way:>12,d} B "
          f"(out+back)  median {1e3 * med:7.2f} ms  min {1e3 * min(seconds):7.2f} ms  {2 * one_way / med / 1e9:5.2f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; reps {args.reps}")
    for rank in (16, 0):
        bench(rank, args.reps)


if __name__ == "__main__":
    main()

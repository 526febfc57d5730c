"""TSP's batched replay on the setting a third party measured it on (UniRL PR 394,
Tencent-Hunyuan/UniRL: "feat(diffusion): batch video replay timesteps"): Wan2.1-1.3B on 16x H20,
48 prompts x 16 videos at 720x1280, 5 frames, 14 denoising steps, 7 trained; its serial replay
took 460.0 s of training and 747.4 s per step, grouped replay 407.9 s and 695.3 s (1.128x and
1.075x). The PR's grouped replay runs K timesteps of a sample in one pass (K=2 in its examples):
here the per-timestep loop trains 1 sample per pass and the packed one 2 (sample, step) pairs.

What the recipe does not say is marked as a guess below (colocated FSDP over the 16 GPUs, as
UniRL trains; CFG, a full fine-tune, PickScore). The simulator runs the colocated-ideal row both
ways and prints the training time (train + its exposed collectives + optimizer, per RL step) and
the step time, and their ratios beside the measured ones.

    PYTHONPATH=. python benchmarks/tsp_unirl.py
"""

from __future__ import annotations

from dataclasses import replace

from digenrl.sim.report import run_spec
from digenrl.sim.testbed import Testbed
from digenrl.sim.workload import RunSpec

MEASURED = {"train": (460.0, 407.9), "step": (747.4, 695.3)}  # UniRL PR 394: serial, grouped (s)
K = 2  # timesteps per grouped pass (the PR's examples)


def testbed(micro_batch: int, train_cfg: bool) -> Testbed:
    return Testbed.from_dict(dict(
        name=f"unirl-pr394-wan1.3b-h20x16-mb{micro_batch}-cfg{int(train_cfg)}",
        pools=[dict(name="h20", count=16, device="H20", role="any", gpus_per_node=8)],
        links=dict(intra_node="nvlink", inter_node="ib-400g", inter_pool="ib-400g"),
        model="wan2.1-1.3b", height=720, width=1280, frames=5, denoise_steps=14, trained_steps=7,
        group_size=16, groups_per_step=48, micro_batch=micro_batch, rollout_batch=1,
        cfg=True, train_cfg=train_cfg,  # guess: Wan's usual CFG; in training too, or not (both shown)
        lora=False, grad_ckpt=True,  # guess: a full fine-tune with activation checkpointing
        kl=False, reward="pickscore", weight_sync="nccl"), source="UniRL PR 394")


def training_s(r) -> float:
    """Training per RL step: the train units, their exposed collectives and the optimizer step."""
    b = r.breakdown_s
    gang = sum(v for k, v in r.overhead_ws.items() if k in ("gang_train", "gang_backward_reduce")) / r.n_gpus
    return b["train"] + b["optimizer"] + gang


def main() -> None:
    print("| training CFG (guess) | | per-timestep (predicted) | packed K=2 (predicted) | ratio predicted "
          "| ratio measured (UniRL) |")
    print("|---|---|---|---|---|---|")
    for train_cfg in (True, False):
        serial = run_spec(testbed(1, train_cfg), RunSpec("colocated", micro_batch_groups=3, style="colocated-ideal",
                                                         packed=False))
        grouped = run_spec(testbed(K, train_cfg), RunSpec("colocated", micro_batch_groups=3,
                                                          style="colocated-ideal", packed=True))
        rows = [("training s/step", training_s(serial), training_s(grouped), MEASURED["train"]),
                ("step s", serial.step_s, grouped.step_s, MEASURED["step"])]
        for name, a, b, (ma, mb) in rows:
            print(f"| {'yes' if train_cfg else 'no'} | {name} | {a:.1f} | {b:.1f} | {a / b:.3f}x "
                  f"| {ma / mb:.3f}x ({ma} -> {mb}) |")


if __name__ == "__main__":
    main()

"""Random split-pool testbeds of the simulator's invariant tests (tests/sim/test_invariants.py)
and of BTS's property on the real simulator (tests/sched/test_bts.py)."""

from __future__ import annotations

import random

from digenrl.sim.catalogue import MODELS

DEVICES = ("H100", "H800", "A100-80G", "L40S", "H200")


# The catalogue entries these draws were written for (the measured five and HunyuanVideo); the
# entries scaled from them since issue 28 (their shapes: /32 VAEs, 8k+1 frames) are planned and
# simulated per family in test_catalogue_families.py. A fixed list keeps every seed's draws.
DRAWN_MODELS = ("flux.1-12b", "hunyuanvideo-13b", "qwen-image-20b", "sd3.5-medium", "wan2.1-1.3b", "wan2.1-14b")


def random_testbed(rng: random.Random, i: int) -> dict:
    """A split pool of 4-128 GPUs and a small RL step of one of DRAWN_MODELS."""
    model = rng.choice(DRAWN_MODELS)
    video = MODELS[model].kind == "video"
    gpus = rng.choice((4, 8, 16, 32, 64, 128))
    denoise = rng.randint(2, 8)
    cfg = rng.random() < 0.4
    lora = rng.random() < 0.5
    return {
        "name": f"inv{i}",
        "pools": [{"name": "all", "count": gpus, "device": rng.choice(DEVICES), "role": "any", "gpus_per_node": 8}],
        "model": model, "height": rng.choice((256, 512)), "width": rng.choice((256, 512)),
        "frames": rng.choice((5, 9)) if video else 1, "denoise_steps": denoise,
        "trained_steps": rng.randint(1, denoise - 1), "group_size": rng.choice((2, 4, 8)),
        "groups_per_step": rng.choice((4, 8, 16)), "micro_batch": rng.randint(1, 4),
        "rollout_batch": rng.randint(1, 4), "cfg": cfg, "train_cfg": cfg and rng.random() < 0.5, "lora": lora,
        "lora_rank": 32, "grad_ckpt": rng.random() < 0.7, "kl": rng.random() < 0.3,
        "reward": "videoalign" if video else rng.choice(("pickscore", "hpsv2", "qwen3-vl-8b")),
        "weight_sync": rng.choice(("nccl", "object-store") + (("lora-only",) if lora else ())),
    }

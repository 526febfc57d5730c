"""Random split-pool testbeds of the simulator's invariant tests (tests/sim/test_invariants.py)
and of BTS's property on the real simulator (tests/sched/test_bts.py, benchmarks/bts_property.py)."""

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


def bts_case(rng: random.Random, i: int):
    """A random small testbed (4 or 8 GPUs, tests/sim/test_invariants.py's draws, a short step)
    and a random point of greedy TAG's planner grid with a rollout pool; None where it does not
    fit or cannot run."""
    from digenrl.sim.planner import grid, snap
    from digenrl.sim.testbed import Testbed, TestbedError

    d = random_testbed(rng, i)
    d["pools"][0]["count"] = rng.choice((4, 8))
    d["groups_per_step"] = rng.choice((4, 8))
    d["denoise_steps"] = min(d["denoise_steps"], 6)
    d["trained_steps"] = min(d["trained_steps"], d["denoise_steps"] - 1)
    try:
        tb = Testbed.from_dict(d)
    except TestbedError:
        return None
    pt = {a: rng.choice(v) for a, v in grid(tb, "gap+tsp+tag").items()}
    pt["n_rollout"] = rng.randint(1, tb.n_gpus - 1)  # a rollout pool: bubbles to weigh
    return d, tb, snap(tb, pt)


def three_modes(tb, pt, cm):
    """Steady-state step seconds of TAG off, greedy TAG and BTS at the same knobs (4 RL steps)."""
    from digenrl.sim.report import run_spec
    from digenrl.sim.workload import RunSpec

    off = RunSpec("gap+tsp", **{k: v for k, v in pt.items() if k != "tag_segment"})
    return tuple(run_spec(tb, s, 4, cm).step_s for s in (off, RunSpec("gap+tsp+tag", **pt), RunSpec("digenrl", **pt)))


def bts_draws(rng: random.Random, n: int, cm):
    """The first n draws of `bts_case` that fit and run: (testbed dict, knobs, step seconds of
    TAG off, greedy TAG and BTS)."""
    ran = 0
    while ran < n:
        case = bts_case(rng, ran)
        if case is None:
            continue
        d, tb, pt = case
        try:
            off, greedy, bts = three_modes(tb, pt, cm)
        except ValueError:  # this point does not fit
            continue
        ran += 1
        yield d, pt, off, greedy, bts

"""Profile the run at hand: the costs of `cfg`'s own policy, learner and rewards on this machine.

`profile_run(cfg)` builds what the trainer builds for `cfg` (policy, Learner, rewarder,
the RL step's SampleSpec) and times, at each batch size, with cfg's worker threads:

    forward                 one sampler step at a trained denoising step     ms per step
    fwd+bwd | ...-frozen-base  Learner.accumulate over one trained step      ms (LoRA: frozen-base)
    reward                  rollout.finish (decode) + rewarder.score         ms
    optimizer               Learner.optimizer_step (clip + AdamW [+ EMA])    ms, "batch": None
    weights                 trainable state dict -> bytes -> second copy     ms, "bytes", "batch": None

Lines are in the calibration format (model, params_B, tokens, shape, what, batch, ms,
peak_GB, device) plus "threads"; a planner reads them for this machine and this config.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Sequence

import torch

from digenrl.learner import Learner
from digenrl.profile.measure import Profiler
from digenrl.profile.targets import Target, diffusers_target, tiny_dit_target
from digenrl.profile.workload import Workload

if TYPE_CHECKING:
    from digenrl.config.schema import Config


def run_workload(cfg: "Config") -> Workload:
    """RL step 0's SampleSpec as the trainer plans it; the timed step is its first trained step."""
    from digenrl.data import PromptSource, load_prompts
    from digenrl.train.trainer import plan_step

    source = PromptSource(load_prompts(cfg.data.prompts), cfg.run.seed, cfg.data.groups_per_step)
    plan = plan_step(cfg, source, 0)
    if not plan.trained_steps:
        raise ValueError("the config trains no denoising step: nothing to profile")
    prompts = [source.prompt(0, g) for g in range(cfg.data.groups_per_step)]
    return Workload(plan.spec, plan.trained_steps[0], prompts, cfg.data.group_size)


def _target(policy, cfg: "Config", work: Workload) -> Target:
    if cfg.model.name == "tiny-dit":
        return tiny_dit_target(policy)
    cond = {k: v[:1] for k, v in policy.encode_prompts(work.prompts[:1]).items()}
    return diffusers_target(policy, cond, cfg.model.name, None, False, log=lambda _: None)


def profile_run(cfg: "Config", *, batches: Sequence[int] = (1, 2, 4, 8), repeats: int = 3,
                progress: bool = False) -> list[dict]:
    """Calibration lines for cfg's model, learner, rewards and weight sync, measured here.

    One warmup and the median of `repeats` per line; torch runs on
    cfg.runtime.worker_threads intra-op threads while measuring (restored after).
    The default tiny-dit config takes seconds on 2 CPU cores. The policy built here is
    trained on by the measurements: do not reuse it.
    """
    from digenrl.models import build_policy
    from digenrl.train.trainer import build_rewarder, learner_config

    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be sizes >= 1, got {tuple(batches)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    batches = sorted(set(batches))
    policy = build_policy(cfg.model, progress=progress)
    learner = Learner(policy, learner_config(cfg))
    work = run_workload(cfg)
    target = _target(policy, cfg, work)
    grad_ckpt = cfg.model.grad_ckpt and target.grad_ckpt  # build_policy enabled it where it exists
    what = "fwd+bwd-frozen-base" if cfg.model.lora_rank > 0 else "fwd+bwd"
    prof = Profiler(torch.device(cfg.model.device), warmup=1, iters=repeats,
                    log=print if progress else (lambda _: None))
    rewarder = build_rewarder(cfg)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.runtime.worker_threads)
    # The profiler collects garbage around every measurement; with diffusers, transformers
    # and peft imported a full collection takes ~0.4 s on 2 cores. Freezing what exists now
    # leaves each collection only the objects the measurements create.
    gc.collect()
    gc.freeze()
    try:
        prof.forward(target, batches, work)
        prof.train(target, batches, grad_ckpt, work, what=what, learner=learner)
        prof.reward(target, batches, work, rewarder)
        prof.optimizer(target, learner)
        prof.weights(target)
    finally:
        gc.unfreeze()
        torch.set_num_threads(threads_before)
        rewarder.close()
    return [dict(r, threads=cfg.runtime.worker_threads) for r in prof.records]

"""Held-out evaluation: deterministic ODE samples of fixed noise, scored by the run's rewards.

    Evaluator(cfg, policy, rewarder).evaluate(step)  -> {"eval/reward_mean", "eval/<part>", ...}

The single-device Trainer calls it between steps; the Ray runtime runs it on an actor of
its own (runtime/workers.py EvalWorker) with a copy of the trainer's weights, so training
never waits for it. Both write the same sample grid (samples/step_N.png + .json).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Optional

import torch

from digenrl.config import Config
from digenrl.data import load_prompts
from digenrl.models import sampling_sigmas
from digenrl.outputs import save_grid
from digenrl.rollout import SampleSpec, generate

EVAL_STEP = -1  # coordinate of eval samples: the same noise at every evaluation


class Evaluator:
    def __init__(self, cfg: Config, policy, rewarder):
        self.cfg, self.policy, self.rewarder = cfg, policy, rewarder
        self.prompts = load_prompts(cfg.data.held_out_prompts(), held_out=True)[: cfg.data.eval_max_prompts]
        self.run_dir = Path(cfg.run.run_dir)
        self.last_rewards: Optional[torch.Tensor] = None  # per sample, prompt order: paired comparisons

    @torch.no_grad()
    def evaluate(self, step: int, *, ema=None, save_images: bool = True) -> dict[str, Any]:
        """Held-out prompts, ODE sampling from fixed noise; with `ema` (learner.EMA) applied."""
        s, d = self.cfg.sampling, self.cfg.data
        spec = SampleSpec(sigmas=sampling_sigmas(self.cfg.model, s, s.eval_num_steps), sde_steps=(),
                          cfg_scale=s.cfg_scale, seed=self.cfg.run.seed)
        n = d.eval_samples
        prompts = [p for p in self.prompts for _ in range(n)]
        coords = [(EVAL_STEP, i, j) for i in range(len(self.prompts)) for j in range(n)]
        self.policy.module.eval()
        images, rewards, parts = [], [], {}
        bs = d.micro_batch_samples or d.micro_batch_groups * d.group_size  # the rollout batch
        with ema.applied() if ema is not None else contextlib.nullcontext():
            for i in range(0, len(prompts), bs):
                traj = generate(self.policy, prompts[i : i + bs], coords[i : i + bs], spec, step=EVAL_STEP,
                                version=step)
                total, p = self.rewarder.score(traj.images, traj.prompts, traj.group_ids)
                images.append(traj.images)
                rewards.append(total)
                for k, v in p.items():
                    parts.setdefault(k, []).append(v)
        images_t = torch.cat(images)
        self.last_rewards = torch.cat(rewards)
        if save_images and images_t.ndim == 4:
            out = self.run_dir / "samples" / f"step_{step:06d}.png"
            save_grid(images_t, out, nrow=n * 4)
            out.with_suffix(".json").write_text(json.dumps(prompts))
        metrics = {"eval/reward_mean": float(self.last_rewards.mean())}
        metrics.update({f"eval/{k}": float(torch.cat(v).mean()) for k, v in parts.items()})
        return metrics

"""Held-out evaluation: deterministic ODE samples of fixed noise, scored by the run's rewards.

    Evaluator(cfg, policy, rewarder).evaluate(step)  -> {"eval/reward_mean", "eval/<part>", ...}

`digenrl sample` and `digenrl eval` (digenrl/tools/posthoc.py) sample through it too, on prompts
of their own, so a run's evaluation and a later one draw the same noise.

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

from digenrl.config.schema import Config
from digenrl.data import check_conditioning, load_images, load_rows
from digenrl.models import sampling_sigmas
from digenrl.io.outputs import save_grid
from digenrl.rollout import SampleSpec, audio_kwargs, generate

EVAL_STEP = -1  # coordinate of eval samples: the same noise at every evaluation


class Evaluator:
    """`rewarder` None: sample only (digenrl sample). `prompts`: these instead of
    data.eval_prompts cut to data.eval_max_prompts (digenrl sample / eval)."""

    def __init__(self, cfg: Config, policy, rewarder, prompts: Optional[list[str]] = None,
                 images: Optional[list[str]] = None):
        """images: the conditioning image file of each of `prompts` (conditioned models)."""
        self.cfg, self.policy, self.rewarder = cfg, policy, rewarder
        if prompts is None:
            rows = load_rows(cfg.data.held_out_prompts(), held_out=True)
            check_conditioning(rows, cfg.model.name, "data.eval_prompts")
            prompts = rows.prompts[: cfg.data.eval_max_prompts]
            images = None if rows.images is None else rows.images[: cfg.data.eval_max_prompts]
        self.prompts = prompts
        self.images = images
        self.run_dir = Path(cfg.run.run_dir)
        self.last_rewards: Optional[torch.Tensor] = None  # per sample, prompt order: paired comparisons
        self.last_parts: dict[str, torch.Tensor] = {}  # per reward (and sub-score), per sample
        self.last_images: Optional[torch.Tensor] = None  # with keep_images: (P * K, 3, H, W) / (P * K, F, 3, H, W)
        self.last_audio: Optional[torch.Tensor] = None  # with keep_images, audio families: (P * K, channels, samples)
        self.audio_rate: Optional[int] = None  # Hz of last_audio

    @torch.no_grad()
    def evaluate(self, step: int, *, ema=None, save_images: bool = True, keep_images: bool = False,
                 bar=None) -> dict[str, Any]:
        """Held-out prompts, ODE sampling from fixed noise; with `ema` (learner.EMA) applied.

        Samples are prompt-major: row i * K + j is sample j of prompt i (K = data.eval_samples),
        drawn from the noise of coordinates (EVAL_STEP, i, j), so two policies evaluated on the
        same prompts see the same noise. `bar`: a tqdm bar advanced by samples generated.
        """
        s, d = self.cfg.sampling, self.cfg.data
        spec = SampleSpec(sigmas=sampling_sigmas(self.cfg.model, s, s.eval_num_steps), sde_steps=(),
                          cfg_scale=s.cfg_scale, cfg_scale_low=s.cfg_scale_low, seed=self.cfg.run.seed,
                          model_timestep=s.model_timestep)
        n = d.eval_samples
        prompts = [p for p in self.prompts for _ in range(n)]
        paths = None if self.images is None else [im for im in self.images for _ in range(n)]
        coords = [(EVAL_STEP, i, j) for i in range(len(self.prompts)) for j in range(n)]
        self.policy.module.eval()
        images, audio, rewards, parts = [], [], [], {}
        bs = d.micro_batch_samples or d.micro_batch_groups * d.group_size  # the rollout batch
        with ema.applied() if ema is not None else contextlib.nullcontext():
            for i in range(0, len(prompts), bs):
                sources = None if paths is None else load_images(paths[i : i + bs], self.policy.height,
                                                                  self.policy.width)
                traj = generate(self.policy, prompts[i : i + bs], coords[i : i + bs], spec, step=EVAL_STEP,
                                version=step, images=sources)
                images.append(traj.images)
                if traj.audio is not None:  # audio families (ltx2): each sample's waveform
                    audio.append(traj.audio)
                    self.audio_rate = traj.audio_rate
                if bar is not None:
                    bar.update(len(traj))
                if self.rewarder is None:
                    continue
                total, p = self.rewarder.score(traj.images, traj.prompts, traj.group_ids, sources, aggregate="sum",
                                               **audio_kwargs(traj))
                rewards.append(total)
                for k, v in p.items():
                    parts.setdefault(k, []).append(v)
        images_t = torch.cat(images)
        self.last_images = images_t if keep_images else None
        self.last_audio = torch.cat(audio) if keep_images and audio else None  # (N, channels, samples)
        self.last_rewards = torch.cat(rewards) if rewards else None
        self.last_parts = {k: torch.cat(v) for k, v in parts.items()}
        if save_images and images_t.ndim == 4:
            out = self.run_dir / "samples" / f"step_{step:06d}.png"
            save_grid(images_t, out, nrow=n * 4)
            out.with_suffix(".json").write_text(json.dumps(prompts))
        if self.last_rewards is None:
            return {}
        metrics = {"eval/reward_mean": float(self.last_rewards.mean())}
        metrics.update({f"eval/{k}": float(v.mean()) for k, v in self.last_parts.items()})
        return metrics

"""The single-device Flow-GRPO trainer: the reference every distributed mode must match.

One RL step:

    prompts (seed, step, group) --> generate micro-batches of whole groups (SDE sampler,
    x_t and behaviour log-probs kept) --> rewards (thread pool, overlapping the next
    micro-batch) --> group advantages --> loss over (micro-batch, chunk of trained steps)
    units, gradients accumulated --> one optimizer step (policy version + 1)

Every random draw is a function of (seed, step, group, sample, denoising step), so the
same config gives the same run on any batch layout, and `--resume` continues exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from digenrl.io import checkpoint as ckpt
from digenrl.config.schema import Config
from digenrl.config.contract import step_shape, tsp_chunk
from digenrl.data import PromptSource, check_conditioning, load_images, load_rows
from digenrl.train.evaluation import Evaluator
from digenrl.learner import Learner, LearnerConfig
from digenrl.math import CLEAN_SAMPLE_LOSSES, group_advantages
from digenrl.math.payload import reads_of
from digenrl.models import build_policy, sampling_sigmas
from digenrl.models.lora import trainable_state_dict
from digenrl.io.recorder import RunRecorder
from digenrl.rewards import AsyncRewarder, build_reward
from digenrl.rollout import SampleSpec, Trajectories, audio_kwargs, generate


@dataclass(frozen=True)
class MicroBatch:
    index: int
    groups: tuple[int, ...]  # scheduler groups (digenrl.config.contract.StepShape)
    prompts: list[str]  # one per sample
    coords: list[tuple[int, int, int]]  # (step, prompt group, sample)
    images: Optional[list[str]] = None  # conditioned models: each sample's image file (its row's)


@dataclass(frozen=True)
class StepPlan:
    """Everything about RL step `step` that does not depend on the weights."""

    step: int
    spec: SampleSpec
    trained_steps: list[int]
    chunks: list[list[int]]  # trained steps per training unit (TSP)
    micro_batches: list[MicroBatch]

    @property
    def samples(self) -> int:
        return sum(len(mb.coords) for mb in self.micro_batches)


def plan_step(cfg: Config, source: PromptSource, step: int) -> StepPlan:
    """The step's prompts, noise coordinates, SDE window and micro-batches, cut exactly as
    the scheduler cuts them (digenrl.config.contract), so a micro-batch index means one thing."""
    spec, trained = step_spec(cfg, step, sampling_sigmas(cfg.model, cfg.sampling, cfg.sampling.num_steps))
    chunk = tsp_chunk(cfg, len(trained))
    chunks = [trained[i : i + chunk] for i in range(0, len(trained), chunk)]
    prompts, images = source.step_prompts(step), source.step_images(step)
    shape = step_shape(cfg)
    mbs = []
    for i, groups in enumerate(shape.micro_batches()):
        rows = shape.samples(groups)  # (prompt group, sample) per row
        mbs.append(MicroBatch(i, groups, [prompts[g] for g, _ in rows], [(step, g, s) for g, s in rows],
                              None if images is None else [images[g] for g, _ in rows]))
    return StepPlan(step, spec, trained, chunks, mbs)


def step_spec(cfg: Config, step: int, sigmas: Optional[torch.Tensor] = None) -> tuple[SampleSpec, list[int]]:
    """RL step `step`'s SampleSpec and its trained slots (the scheduler's trained steps).
    sigmas: the run's grid (plan_step's); None puts linspace(1, 0) in its place, for callers that
    read only which steps are sampled, trained and shipped (sim.trajectories: no model files)."""
    s = cfg.sampling
    if sigmas is None:
        sigmas = torch.linspace(1.0, 0.0, s.num_steps + 1)
    sde_steps, trained = s.sde_window().select(s.num_steps, cfg.run.seed, step)
    nft = cfg.train.loss in CLEAN_SAMPLE_LOSSES  # DiffusionNFT, Diffusion-DPO, AWM: forward-process levels
    draw_levels = 0
    if s.window_draw == "sample":
        # the scheduler's trained steps become slots 0..k-1; each sample maps slot j to its own
        # step among the SDE steps (every step but the last), or, for DiffusionNFT, among all
        # noise levels of the grid (sigmas[0..N-1], all > 0)
        draw_levels = s.num_steps if nft else len(sde_steps)
        trained = list(range(len(trained)))
    spec = SampleSpec(
        sigmas=sigmas,
        sde_steps=() if s.sde == "ode" else tuple(sde_steps),
        kind=s.sde,
        noise_level=s.noise_level,
        cfg_scale=s.cfg_scale,
        cfg_scale_low=s.cfg_scale_low,
        seed=cfg.run.seed,
        draw_levels=draw_levels,
        rollout_dtype=s.rollout_dtype,
        model_timestep=s.model_timestep,
        trained_slots=tuple(trained),
        reads=reads_of(cfg.train.loss),  # what leaves a rollout worker (rollout.sampler.ship)
    )
    return spec, trained


def prompt_source(cfg: Config) -> PromptSource:
    """data.prompts as a PromptSource; images exactly when model.name is conditioned."""
    rows = load_rows(cfg.data.prompts)
    check_conditioning(rows, cfg.model.name, "data.prompts")
    return PromptSource(rows.prompts, cfg.run.seed, cfg.data.groups_per_step, images=rows.images)


def condition_images(policy, paths: Optional[list[str]]) -> Optional[torch.Tensor]:
    """Each sample's conditioning image (B, 3, H, W) in [0, 1] at the policy's output size, or None."""
    return None if paths is None else load_images(paths, policy.height, policy.width)


def learner_config(cfg: Config) -> LearnerConfig:
    """The learner's settings from cfg.train (and reward.adv_clip, DiffusionNFT's clip)."""
    t = cfg.train
    return LearnerConfig(lr=t.lr, weight_decay=t.weight_decay, clip_range=t.clip_range, beta=t.beta,
                         max_grad_norm=t.max_grad_norm, ema_decay=t.ema_decay, backward_batch=t.backward_batch,
                         pairs_per_pass=t.pairs_per_pass, loss=t.loss, adv_clip=cfg.reward.adv_clip, grad_sum=t.grad_sum,
                         behaviour_logp=t.behaviour_logp, is_correction=t.is_correction, is_band=t.is_band,
                         nft_decay=t.nft_decay, nft_decay_rate=t.nft_decay_rate, nft_decay_flat=t.nft_decay_flat,
                         nft_beta=t.nft_beta, dpo_beta=t.dpo_beta, dpo_pairs=t.dpo_pairs, dpo_margin=t.dpo_margin,
                         kl_mask_threshold=t.kl_mask_threshold, awm_adv_max=t.awm_adv_max,
                         awm_weighting=t.awm_weighting, awm_ghuber_power=t.awm_ghuber_power)


def assign_advantages(trajs: list[Trajectories], cfg: Config) -> None:
    """Group advantages; with adv_std=global the std spans the whole step."""
    rewards = torch.cat([t.rewards for t in trajs])
    groups = torch.cat([t.group_ids for t in trajs])
    adv = group_advantages(rewards, groups, std=cfg.reward.adv_std, clip=cfg.reward.adv_clip)
    for t, a in zip(trajs, adv.split([len(t) for t in trajs])):
        t.advantages = a


def build_rewarder(cfg: Config) -> AsyncRewarder:
    fns = {name: build_reward(name, cfg.reward.paths, cfg.model.device) for name in cfg.reward.weights}
    return AsyncRewarder(fns, cfg.reward.weights, aggregate=cfg.reward.aggregate, threads=cfg.reward.threads)


def step_metrics(trajs: list[Trajectories], learner_metrics: dict[str, float]) -> dict[str, Any]:
    rewards = torch.cat([t.rewards for t in trajs])
    out: dict[str, Any] = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(unbiased=False)),
        "loss": learner_metrics.get("loss/policy", 0.0) + learner_metrics.get("loss/kl", 0.0),
        "clipfrac": learner_metrics.get("loss/clipfrac", 0.0),
        "ratio_mean": learner_metrics.get("loss/ratio_mean", 1.0),
        "samples": int(rewards.numel()),
    }
    for name in trajs[0].reward_parts:
        out[f"rollout/{name}"] = float(torch.cat([t.reward_parts[name] for t in trajs]).mean())
    out.update(learner_metrics)
    return out


class Trainer:
    def __init__(self, cfg: Config, *, progress: bool = True, policy=None, lean: bool = False):
        """policy: one built already (a trainer gang rank's, on the meta device until its gang
        shards it: runtime/gang_rank.py); None builds cfg.model's. lean: the rewarder and the
        evaluator are built at their first use, not here (a trainer rank of a Ray run, where
        rewards and evaluation usually run elsewhere: runtime/workers.py TrainerRank)."""
        self.cfg = cfg
        self.progress = progress
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.run_dir = Path(cfg.run.run_dir)
        self.policy = policy if policy is not None else build_policy(cfg.model, progress=progress)
        self.learner = Learner(self.policy, learner_config(cfg))
        self.source = prompt_source(cfg)
        self._rewarder: Optional[AsyncRewarder] = None
        self._evaluator: Optional[Evaluator] = None
        if not lean:
            self._evaluator = Evaluator(cfg, self.policy, self.rewarder)
        self.recorder = RunRecorder(cfg, progress=progress)
        self.step = 0  # next RL step to run == policy version
        self.wall_s = 0.0

    @property
    def rewarder(self) -> AsyncRewarder:
        """The configured rewarder (built at first use when lean)."""
        if self._rewarder is None:
            self._rewarder = build_rewarder(self.cfg)
        return self._rewarder

    @property
    def evaluator(self) -> Evaluator:
        """Held-out evaluation over this trainer's policy and rewarder (built at first use when lean)."""
        if self._evaluator is None:
            self._evaluator = Evaluator(self.cfg, self.policy, self.rewarder)
        return self._evaluator

    def close(self) -> None:
        """Close the rewarder, if one was built."""
        if self._rewarder is not None:
            self._rewarder.close()

    # -- one RL step --------------------------------------------------------------
    def rl_step(self, step: int) -> dict[str, Any]:
        plan = plan_step(self.cfg, self.source, step)
        self.policy.module.eval()
        trajs, futures = [], []
        t0 = time.perf_counter()
        with self.learner.sampling_weights():  # DiffusionNFT's old policy samples, when kept
            for mb in plan.micro_batches:
                sources = condition_images(self.policy, mb.images)  # (B, 3, H, W) or None
                traj = generate(self.policy, mb.prompts, mb.coords, plan.spec, step=step, version=step,
                                images=sources)
                trajs.append(traj)
                futures.append(self.rewarder.submit(traj.images, traj.prompts, traj.group_ids, sources,
                                                    **audio_kwargs(traj)))
        gen_s = time.perf_counter() - t0
        for traj, fut in zip(trajs, futures):
            traj.rewards, traj.reward_parts = fut.result()
        assign_advantages(trajs, self.cfg)
        t1 = time.perf_counter()
        for traj in trajs:
            for chunk in plan.chunks:
                self.learner.accumulate(
                    traj, chunk, plan.spec, total_samples=plan.samples, total_steps=len(plan.trained_steps)
                )
        lm = self.learner.optimizer_step(version=step + 1)
        train_s = time.perf_counter() - t1
        metrics = step_metrics(trajs, lm)
        metrics["timing/generate_s"] = gen_s
        metrics["timing/train_s"] = train_s
        return metrics

    # -- evaluation ---------------------------------------------------------------
    def evaluate(self, step: int, save_images: bool = True) -> dict[str, Any]:
        """Held-out prompts, deterministic ODE sampling from fixed noise (EMA weights if on)."""
        metrics = self.evaluator.evaluate(step, ema=self.learner.ema, save_images=save_images)
        self.last_eval_rewards = self.evaluator.last_rewards
        return metrics

    # -- checkpoints ----------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """state.json of a checkpoint after `self.step` steps (both layouts write the same)."""
        return {
            "step": self.step,
            "version": self.step,
            "data_cursor": self.source.cursor(self.step),
            "wall_s": self.wall_s,
            "config": self.cfg.to_dict(),
        }

    def save(self) -> Path:
        return ckpt.save_checkpoint(
            self.run_dir,
            self.step,
            policy_state=trainable_state_dict(self.policy.module),
            optimizer=self.learner.optimizer,
            ema_state=self.learner.ema.state_dict() if self.learner.ema is not None else None,
            old_state=self.learner.old.state_dict() if self.learner.old is not None else None,
            state=self.checkpoint_state(),
            keep=self.cfg.run.keep_checkpoints,
        )

    def load(self, path: Path, group=None) -> None:
        """Resume from a checkpoint of either layout: this trainer's own, or the `dcp/` of a
        sharded gang of any size (read whole into this unsharded policy, or resharded into a
        gang's: `group` is then the gang's process group, every rank calls this)."""
        state = ckpt.load_checkpoint(path, self.policy.module, self.learner.optimizer, self.learner.ema, group,
                                     old=self.learner.old)
        self.step = state["step"]
        self.wall_s = state.get("wall_s", 0.0)
        if state["data_cursor"] != self.source.cursor(self.step):
            raise ValueError(f"{path}: data cursor {state['data_cursor']} does not match step {self.step}")

    # -- the loop ---------------------------------------------------------------------
    def train(self, *, resume: bool = False) -> dict[str, Any]:
        cfg, rec = self.cfg, self.recorder
        latest = rec.resume_checkpoint() if resume else None
        if latest is not None:
            self.load(latest)
        rec.open(resumed_from=self.step if latest is not None else None)
        try:
            if rec.eval_due(self.step):  # the base model, on a fresh run
                rec.log({"step": self.step, **self.evaluate(self.step)})
            for step in range(self.step, cfg.train.steps):
                t0 = time.perf_counter()
                m = self.rl_step(step)
                self.step = step + 1
                dt = time.perf_counter() - t0
                self.wall_s += dt
                record = {"step": self.step, **m, "step_s": dt, "wall_s": self.wall_s, "samples_per_s": m["samples"] / dt}
                if rec.eval_due(self.step):
                    record.update(self.evaluate(self.step))
                rec.log(record)
                if rec.checkpoint_due(self.step):
                    self.save()
        finally:
            rec.close()
            self.close()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Final weights, reward plot and summary.json (see `RunRecorder.finish`)."""
        ema = self.learner.ema.state_dict() if self.learner.ema is not None else None
        return self.recorder.finish(trainable_state_dict(self.policy.module), ema, steps=self.step,
                                    wall_s=self.wall_s)

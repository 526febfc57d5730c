"""Typed run configuration: dataclasses validated at construction, from YAML and key=value.

    cfg = load_config("recipes/toy_fast.yaml", ["train.steps=20", "data.group_size=8"])

Unknown keys and bad values fail before any work starts, naming the key and what is
allowed.
"""

from __future__ import annotations

import copy
import functools
import dataclasses
import math
import typing
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import yaml

# torch-free (the simulator builds these sections): the vocabularies, not their implementations
from digenrl.math.kinds import (AGGREGATE_KINDS, AWM_WEIGHTINGS, BEHAVIOUR_KINDS, CLEAN_SAMPLE_LOSSES, DPO_PAIRS,
                                GRAD_SUMS, IS_KINDS, LOSS_KINDS, MODEL_TIMESTEPS, ROLLOUT_DTYPES, SDE_KINDS, STD_KINDS)
from digenrl.math.window import WINDOW_DRAWS, WINDOW_KINDS, SdeWindow
from digenrl.models.diffusers_adapters import CONDITIONING, EMBEDDED_GUIDANCE, EXPERT_CHOICES, FAMILIES, TWO_EXPERTS
from digenrl.models.diffusers_adapters.grids import GRID_FAMILIES, SIGMA_GRIDS
from digenrl.prompt_sets import PromptSetError, check_spec, parse_spec
from digenrl.sched import BATCH_MODES, GAP_MODES, TAG_MODES
from digenrl.sched import MODES as SCHED_MODES

MODEL_NAMES = ("tiny-dit", *FAMILIES)
MODES = ("local", *SCHED_MODES)  # local: the single-device Trainer, no scheduler
SHARD_KINDS = ("none", "fsdp")
# adapters with sequence-parallel attention
SP_FAMILIES = ("wan", "hunyuan-video", "hunyuan-video-1.5", "hunyuan-video-1.5-i2v")
RESHARD_KINDS = ("after-forward", "after-step")
# rollout-pool keys of spot workers and autoscaling (refused on the other pools)
SPOT_KEYS = ("preemptible", "notice_s", "notices", "preemptions", "max_workers", "watch", "metadata_url",
             "watch_poll_s")
WATCH_CLOUDS = ("aws", "gce", "azure")  # runtime.rollout.watch: whose metadata service each node's watcher polls
# runtime.trainer.tag_offload: when a trainer's TAG switch offloads its uncommitted state (sim/tag_switch.py)
TAG_OFFLOAD = ("auto", "always", "never")
LOGGERS = ("tensorboard", "wandb")  # run.loggers: where step metrics go besides metrics.jsonl
WANDB_MODES = ("online", "offline", "disabled")
# runtime.weight_sync: how new weights reach the rollout workers (the simulator prices each)
WEIGHT_SYNC_METHODS = ("object-store", "nccl", "lora-only")


class ConfigError(ValueError):
    """A configuration key has a value that is not allowed."""


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _one_of(value: Any, key: str, allowed: tuple) -> None:
    _check(value in allowed, key, f"{value!r} is not allowed; choose one of: {', '.join(map(str, allowed))}")


@dataclass
class ModelConfig:
    """The policy: which model, its weights, precision, LoRA and resolution."""

    name: str = "tiny-dit"  # the policy: tiny-dit (the toy world's small DiT, CPU) or a diffusers family
    # tiny-dit: None = the shipped toy base, else a .safetensors file; other families: a local
    # pipeline folder or a hub id ('org/name') already in the HF cache. `digenrl train` refuses
    # a path that does not exist before any work (digenrl/tools/preflight.py).
    path: Optional[str] = None
    dtype: str = "float32"  # float32 | bfloat16 | float16 (SDE math is float32 regardless)
    device: str = "cpu"  # torch device of the policy (cpu, cuda, cuda:1); Ray workers each see their own GPUs
    lora_rank: int = 16  # 0 = full fine-tune (then lower train.lr: 1e-4 for the tiny DiT)
    lora_alpha: float = 16.0  # LoRA scale numerator: the adapter's update is scaled by lora_alpha / lora_rank
    lora_targets: list[str] = field(default_factory=list)  # empty = the family's default
    grad_ckpt: bool = False  # activation (gradient) checkpointing in training: less memory, one more forward
    height: int = 0  # pixels; 0 = the model's default resolution
    width: int = 0  # pixels; 0 = the model's default resolution
    frames: int = 0  # video models only; 0 = default
    prompt_cache: Optional[str] = None  # folder of cached prompt embeddings (diffusers models)
    text_encoders: bool = True  # false: load no text encoders, every prompt must be in prompt_cache
    # text tokens per prompt (T5 / UMT5 / Llama sequence); 0 = the family's default (sd3 256,
    # flux 512, wan 512, qwen-image 256, hunyuan-video 256, flux-kontext 512, wan-i2v 512 (the
    # only length it takes), qwen-image-edit 1024). Part of the prompt cache's key.
    max_sequence_length: int = 0
    # embedded guidance scale of guidance-distilled families (flux, hunyuan-video: a model
    # input, not a CFG batch); 0 = the adapter's default 3.5. Other families refuse it.
    guidance: float = 0.0
    # two-expert families (wan2.2): which denoiser trains: both, high (the high-noise expert,
    # sigma >= the pipeline's boundary_ratio) or low; the other is frozen (no LoRA, no grad).
    # "" = both. Other families refuse it.
    experts: str = ""

    def __post_init__(self) -> None:
        _one_of(self.name, "model.name", MODEL_NAMES)
        _one_of(self.dtype, "model.dtype", ("float32", "bfloat16", "float16"))
        _check(self.lora_rank >= 0, "model.lora_rank", f"must be >= 0 (0 = full fine-tune), got {self.lora_rank}")
        _check(self.text_encoders or bool(self.prompt_cache), "model.text_encoders",
               "false needs model.prompt_cache (prompts can then only come from the cache)")
        for k in ("height", "width", "frames"):
            _check(getattr(self, k) >= 0, f"model.{k}", "must be >= 0")
        _check(self.max_sequence_length >= 0, "model.max_sequence_length", "must be >= 0 (0 = the family's default)")
        _check(self.max_sequence_length == 0 or self.name != "tiny-dit", "model.max_sequence_length",
               "sets a diffusers family's text length; tiny-dit has its own tokenizer: leave it at 0")
        _check(self.guidance >= 0, "model.guidance", "must be >= 0 (0 = the adapter's default)")
        _check(self.guidance == 0 or self.name in EMBEDDED_GUIDANCE, "model.guidance",
               f"{self.name} has no embedded guidance (only {', '.join(EMBEDDED_GUIDANCE)} do); "
               "use sampling.cfg_scale for classifier-free guidance, and leave model.guidance at 0")
        _check(not self.experts or self.name in TWO_EXPERTS, "model.experts",
               f"{self.name} has one transformer (only {', '.join(TWO_EXPERTS)} have two experts); leave it empty")
        if self.experts:
            _one_of(self.experts, "model.experts", EXPERT_CHOICES)


@dataclass
class SamplingConfig:
    """How rollouts denoise: the sigma grid, the SDE, guidance, and which steps are SDE and trained."""

    num_steps: int = 10  # denoising steps per rollout
    eval_num_steps: int = 10  # denoising steps of held-out evaluation (ODE, same noise at every evaluation)
    # digenrl: shift(linspace(1, 0, num_steps + 1)) with `shift`; diffusers: the grid the
    # model family's diffusers pipeline asks its scheduler for (shift from model.path's
    # scheduler config, FLUX / Qwen-Image: dynamic from the resolution). See docs/models.md.
    sigmas: str = "digenrl"
    shift: float = 1.0  # SD3 time shift of the digenrl grid
    # the stochastic step of the SDE window: flow-sde (Flow-GRPO), dance-sde (DanceGRPO), cps
    # (coefficients-preserving) or ode (no noise, no log-probs: train.loss=nft, dpo or awm only); digenrl.math.sde
    sde: str = "flow-sde"
    # the SDE's noise scale: `a` of flow-sde and cps, `eta` of dance-sde (ode draws none)
    noise_level: float = 0.7
    cfg_scale: float = 1.0  # classifier-free guidance scale; 1 = no guidance (no doubled batch)
    # two-expert families (wan2.2): the low-noise expert's CFG scale (diffusers' guidance_scale_2;
    # cfg_scale is then the high-noise expert's, guidance_scale). 0 = cfg_scale for both.
    # Other families refuse it.
    cfg_scale_low: float = 0.0
    # which steps are SDE / trained: see math.schedule.SdeWindow. The default trains the first
    # window_size steps (ODE after): on the toy world it learns several times faster per
    # second than all-but-last (docs/getting-started.md); the real-model recipes name theirs
    window: str = "first"
    window_size: int = 2  # first, contiguous, sliding: how many denoising steps the window holds
    window_stride: int = 1  # sliding: how many steps the window moves each time it moves
    window_every: int = 10  # sliding: the window moves every this many RL steps (wrapping)
    window_fraction: float = 0.6  # fraction: the share of SDE steps trained, drawn at random, in (0, 1]
    # step: one set of trained steps per RL step, shared by its samples; sample: each sample
    # draws its own (DanceGRPO's per-sample fraction; DiffusionNFT's per-sample noise levels).
    # See rollout.sampler.trained_steps.
    window_draw: str = "step"
    # "" = rollouts compute in model.dtype like the trainer; bfloat16 = the rollout's denoiser
    # forwards run under bf16 autocast while the trainer scores in model.dtype (float32): a
    # rollout engine at lower precision, to measure the rollout-train log-prob gap
    # (consistency/* metrics) and test its corrections on any machine
    rollout_dtype: str = ""
    # -- DanceGRPO's model timestep (issue 27) --
    # exact: the model is conditioned on sigma; floor: on int(sigma * 1000) / 1000, as DanceGRPO
    # conditions its transformer, while every SDE step, log-prob and forward-process target
    # keeps the exact sigma (rollout.sampler.SampleSpec.model_sigma)
    model_timestep: str = "exact"

    def __post_init__(self) -> None:
        _one_of(self.model_timestep, "sampling.model_timestep", MODEL_TIMESTEPS)
        _check(self.num_steps >= 2, "sampling.num_steps", f"must be >= 2, got {self.num_steps}")
        _one_of(self.rollout_dtype, "sampling.rollout_dtype", ROLLOUT_DTYPES)
        _check(self.eval_num_steps >= 1, "sampling.eval_num_steps", "must be >= 1")
        _check(self.shift > 0, "sampling.shift", "must be > 0")
        _one_of(self.sigmas, "sampling.sigmas", SIGMA_GRIDS)
        _check(self.sigmas == "digenrl" or self.shift == 1.0, "sampling.shift",
               "shifts the digenrl grid only; sampling.sigmas=diffusers takes its shift from the pipeline's "
               "scheduler config (model.path/scheduler/scheduler_config.json): leave sampling.shift at 1.0")
        _one_of(self.sde, "sampling.sde", SDE_KINDS)
        _check(self.noise_level > 0, "sampling.noise_level", "must be > 0")
        _check(self.sde != "ode" or self.noise_level == 0.7, "sampling.noise_level",
               "sampling.sde=ode draws no noise: leave sampling.noise_level at its default 0.7")
        _one_of(self.window_draw, "sampling.window_draw", WINDOW_DRAWS)
        _check(self.cfg_scale >= 1.0, "sampling.cfg_scale", "must be >= 1 (1 = no guidance)")
        _check(self.cfg_scale_low == 0 or self.cfg_scale_low >= 1.0, "sampling.cfg_scale_low",
               f"must be >= 1 (1 = no guidance in the low-noise expert), or 0 (= sampling.cfg_scale), "
               f"got {self.cfg_scale_low}")
        _one_of(self.window, "sampling.window", WINDOW_KINDS)
        try:
            self.sde_window().validate(self.num_steps)
        except ValueError as e:
            raise ConfigError(f"sampling.window_size: {e}") from None

    @property
    def guided(self) -> bool:
        """Whether any step runs classifier-free guidance (a doubled batch)."""
        return self.cfg_scale != 1.0 or self.cfg_scale_low not in (0.0, 1.0)

    def sde_window(self) -> SdeWindow:
        try:
            return SdeWindow(
                self.window, self.window_size, self.window_stride, self.window_every, self.window_fraction
            )
        except ValueError as e:
            raise ConfigError(f"sampling.window: {e}") from None


@dataclass
class DataConfig:
    """Prompts and the shape of an RL step: prompt groups, samples per group, micro-batches."""

    # "toy", a named set ("pickscore" = its train split, "pickscore:test"; digenrl/prompt_sets:
    # pickscore, ocr, geneval, drawbench), a text file, one prompt per line, or a .jsonl file of
    # {"prompt": ..., "image": path relative to the file} rows (conditioned families need images)
    prompts: str = "toy"
    # the held-out prompts, the same forms (a bare set name = its test split); "auto": toy ->
    # toy-held-out, a named set -> that set's test split, a file -> toy-held-out
    eval_prompts: str = "auto"
    groups_per_step: int = 8  # prompts per RL step
    group_size: int = 4  # samples per prompt (the GRPO group)
    micro_batch_groups: int = 2  # whole groups per generation / training micro-batch
    # > 0: micro-batches of this many samples that may cut prompt groups (flow_grpo's
    # per-GPU batches); only where nothing trains before the whole step is rewarded
    # (run.mode local, colocated, disagg-sync, one-step-off). 0 = whole groups.
    micro_batch_samples: int = 0
    eval_samples: int = 8  # samples per eval prompt (same noise at every evaluation)
    eval_max_prompts: int = 16  # held-out prompts evaluated: the first this many of data.eval_prompts

    def __post_init__(self) -> None:
        _check(
            self.group_size >= 2,
            "data.group_size",
            f"must be >= 2: with {self.group_size} sample(s) per prompt every group-relative advantage is 0",
        )
        _check(self.groups_per_step >= 1, "data.groups_per_step", "must be >= 1")
        _check(
            1 <= self.micro_batch_groups <= self.groups_per_step,
            "data.micro_batch_groups",
            f"must be in [1, groups_per_step={self.groups_per_step}], got {self.micro_batch_groups}",
        )
        _check(self.eval_samples >= 1, "data.eval_samples", "must be >= 1")
        _check(0 <= self.micro_batch_samples <= self.groups_per_step * self.group_size,
               "data.micro_batch_samples",
               f"must be in [0, samples per step={self.groups_per_step * self.group_size}] (0 = whole groups)")
        # a named set's name and split are checked here, before any file is read; files (and
        # whether a set is fetched) are checked by digenrl/tools/preflight.py
        for key, spec, held_out in (("data.prompts", self.prompts, False),
                                    ("data.eval_prompts", self.eval_prompts, True)):
            try:
                check_spec(spec, held_out=held_out)
            except PromptSetError as e:
                raise ConfigError(f"{key}: {e}") from None

    def held_out_prompts(self) -> str:
        """What data.eval_prompts reads, with "auto" resolved against data.prompts."""
        if self.eval_prompts != "auto":
            return self.eval_prompts
        parsed = parse_spec(self.prompts)
        return f"{parsed[0]}:test" if parsed is not None else "toy-held-out"


@dataclass
class RewardConfig:
    """Which rewards score the samples, how they combine, and how advantages are formed."""

    # reward name -> weight; the names are digenrl.rewards.REWARD_NAMES (see docs/models.md). Several
    # rewards are combined per sample by reward.aggregate
    weights: dict[str, float] = field(default_factory=lambda: {"toy-geneval": 1.0})
    # sum: the weighted sum of the raw rewards; gdpo: each reward standardised within its prompt
    # group first, then the weighted sum (GDPO, arXiv 2601.05242); its batch normalisation is
    # reward.adv_std=global (none where the mode streams), so gdpo refuses adv_std=group
    aggregate: str = "sum"
    paths: dict[str, str] = field(default_factory=dict)  # reward name -> local model folder or server URL
    threads: int = 2  # reward computation overlaps generation in a thread pool
    # advantage = (reward - group mean) / std, the std of the prompt group, of the whole RL
    # step (global), or none (Dr.GRPO: no division)
    adv_std: str = "group"
    adv_clip: float = 5.0  # advantages are clipped to [-adv_clip, adv_clip]

    def __post_init__(self) -> None:
        from digenrl.rewards import REWARD_NAMES

        _check(bool(self.weights), "reward.weights", "name at least one reward")
        for name in self.weights:
            _one_of(name, f"reward.weights.{name}", REWARD_NAMES)
        if "remote" in self.paths:
            url, _, served = self.paths["remote"].partition("#")
            _check(url.startswith(("http://", "https://")) and bool(served), "reward.paths.remote",
                   f"{self.paths['remote']!r} is not <http(s)://host:port>#<served reward name>, "
                   "e.g. http://10.0.0.5:8000#pickscore")
            from digenrl.rewards import AUDIO_REWARDS, SOURCE_REWARDS

            _check(served not in AUDIO_REWARDS + SOURCE_REWARDS, "reward.paths.remote",
                   f"#{served} scores the generated audio or each sample's source image, which a reward "
                   f"server's requests do not carry (images and prompts only): use reward.weights.{served}")
        for name in self.weights:  # keys a model reward does not take fail here, not on a worker
            if name in self.paths:
                from digenrl.rewards.registry_models import check_args as check_reward_args  # torch

                try:
                    check_reward_args(name, self.paths[name])
                except ValueError as e:
                    raise ConfigError(f"reward.paths.{name}: {e}") from None
        _one_of(self.aggregate, "reward.aggregate", AGGREGATE_KINDS)
        _one_of(self.adv_std, "reward.adv_std", STD_KINDS)
        _check(self.aggregate != "gdpo" or self.adv_std != "group", "reward.adv_std",
               "group re-standardises each group's GDPO sum, which collapses distinct reward combinations "
               "into one advantage again (what GDPO removes); use global (GDPO's batch normalisation) or none "
               "(the GDPO sum as the advantage, for modes that stream)")
        _check(self.threads >= 1, "reward.threads", "must be >= 1")


@dataclass
class TrainConfig:
    """The loss and the optimizer step: RL steps, learning rate, clipping, KL, training units."""

    steps: int = 160  # RL steps (one optimizer step each) the run ends at
    lr: float = 1e-3  # AdamW learning rate; for the default LoRA; full fine-tunes of the tiny DiT drift above 1e-4
    weight_decay: float = 0.0  # AdamW weight decay of the trained parameters
    clip_range: float = 1e-4  # log-probs are averaged over dims, so ratios stay near 1
    beta: float = 0.0  # KL weight to the base model
    max_grad_norm: float = 1.0  # the step's summed gradient is clipped to this global L2 norm
    ema_decay: float = 0.0  # 0 = off
    # Trained denoising steps per training unit, in every mode (batch-level modes: an even
    # data-parallel share). 0 = the mode's default: 1 under TSP (gap+tsp, gap+tsp+tag,
    # digenrl), else all trained steps in one unit. See digenrl.config.contract.tsp_chunk.
    tsp_chunk: int = 0
    backward_batch: int = 0  # samples per forward/backward (activation memory); 0 = whole micro-batch
    # TSP's batched replay (digenrl.learner.passes): a Train unit's (sample, trained step) pairs,
    # flattened across its trained steps, run this many to a forward/backward, each pair at its
    # own timestep; 0 = one pass per trained step (and backward_batch chunk), the per-timestep
    # loop. train.loss=dpo packs whole pairs of a group, as many trained steps as fit.
    pairs_per_pass: int = 0
    # grpo: Flow-GRPO's clipped ratio; grpo-guard: GRPO-Guard's RatioNorm + 1/dt reweighting
    # (arXiv 2510.22319, digenrl.math.loss.grpo_guard_loss)
    loss: str = "grpo"
    # The dtype an RL step's gradient is summed in over its training units and across trainers:
    # float64 makes the sum independent of which trainer ran which unit and in what order
    # (digenrl.math.grad_sum); float32 costs half the memory and all-reduce bytes; auto =
    # float64 up to 2^28 trainable parameters (LoRA, small models), else float32.
    grad_sum: str = "auto"
    # -- rollout-train consistency (docs/models.md, "Rollout-train consistency") --
    # The log-prob the ratio divides by: rollout (what the rollout recorded) or recompute (the
    # trainer's own for the same step under the same weights, veRL's choice: the ratio is then 1
    # in value and the rollout-train gap moves to train.is_correction). Every step reports the
    # gap either way (consistency/* in metrics.jsonl). recompute costs no forward here: it is the
    # loss forward's own log-prob, detached (one optimizer step per RL step)
    behaviour_logp: str = "rollout"
    # none; truncated: each row's loss times min(pi_train / pi_rollout, train.is_band) (veRL's
    # TIS); mask: rows whose pi_train / pi_rollout leaves [1 / is_band, is_band] are dropped.
    # Needs train.behaviour_logp=recompute
    is_correction: str = "none"
    is_band: float = 2.0  # the correction's bound C (> 1): truncated caps at C, mask keeps [1/C, C]
    # -- DiffusionNFT's old policy (issue 27) --
    # train.loss=nft: the old policy that samples every rollout and anchors the loss is kept as
    # old <- d old + (1 - d) new after each optimizer step, d = min((k - flat) * rate, nft_decay)
    # at version k >= flat, else 0 (NVlabs/DiffusionNFT return_decay: their decay_type 1 is
    # nft_decay 0.5, rate 0.001, flat 0; type 2 is 0.999, 0.0075, 75). 0 = their type 0: the
    # old policy is the step's start policy, no copy kept (digenrl.learner.old_policy)
    nft_decay: float = 0.0
    nft_decay_rate: float = 0.001  # the old-policy decay's rise per optimizer step (train.nft_decay > 0)
    nft_decay_flat: int = 0  # optimizer steps at decay 0 before it rises (train.nft_decay > 0)
    # DiffusionNFT's guidance strength beta: the implicit policies are v_old +- beta (v - v_old)
    # and the loss is scaled by 1 / beta (digenrl.math.loss.nft_loss); it acts only with an
    # old policy kept (train.nft_decay > 0). Not train.beta, the KL weight.
    nft_beta: float = 1.0
    # -- Advantage Weighted Matching (issue 27) --
    # train.loss=awm: the flow-matching error of the clean sample noised afresh, weighted by its
    # advantage A' = clip(A, -reward.adv_clip, reward.adv_clip) * awm_adv_max / reward.adv_clip
    # (scxue/advantage_weighted_matching scripts/train_sd3_awm.py:1293-1299: their advantage_max 1
    # over adv_clip_max 5); digenrl.math.loss.awm_loss. Noise draws per sample = trained slots
    # (sampling.window, window_draw=sample: each sample its own noise levels).
    awm_adv_max: float = 1.0
    # the error's weighting: uniform | t (x sigma) | t2 (x sigma^2) | ghuber (the authors' SD3.5
    # configs, power awm_ghuber_power 0.25): train_sd3_awm.py:240-251
    awm_weighting: str = "uniform"
    awm_ghuber_power: float = 0.25  # the power of awm_weighting=ghuber (the authors: 0.25)
    # -- end AWM --
    # -- online Diffusion-DPO and Flow-DPPO (issue 27; docs/models.md) --
    # train.loss=dpo: -log sigmoid(-dpo_beta / 2 ((err_w - err_ref_w) - (err_l - err_ref_l))) on
    # (winner, loser) pairs of each prompt group (digenrl.math.dpo), the reference being the base
    # model. dpo_beta: the peers' beta (flow_grpo config/dpo.py and veRL-Omni's online DPO: 100).
    dpo_beta: float = 100.0
    # best-worst: one pair per group, its highest and lowest advantage (both peers); margin:
    # every pair whose advantages differ by more than train.dpo_margin
    dpo_pairs: str = "best-worst"
    dpo_margin: float = 0.0  # train.dpo_pairs=margin: the advantage gap a pair must exceed
    # train.loss=flow-dppo: a unit whose Gaussian step divergence to the behaviour policy is
    # >= this, and still moving away, is dropped (veRL-Omni / UniRL kl_mask_threshold, 1e-5)
    kl_mask_threshold: float = 1e-5

    def __post_init__(self) -> None:
        self._check_awm()
        self._check_nft_old_policy()
        self._check_dpo()
        _check(self.steps >= 1, "train.steps", "must be >= 1")
        _one_of(self.behaviour_logp, "train.behaviour_logp", BEHAVIOUR_KINDS)
        _one_of(self.is_correction, "train.is_correction", IS_KINDS)
        _check(self.loss != "nft" or self.behaviour_logp == "rollout", "train.behaviour_logp",
               "DiffusionNFT trains on clean samples, without a log-prob ratio: leave it at rollout with train.loss=nft")
        _check(self.loss != "nft" or self.is_correction == "none", "train.is_correction",
               "DiffusionNFT has no log-prob ratio to correct: leave it at none with train.loss=nft")
        _check(self.is_correction == "none" or self.behaviour_logp == "recompute", "train.is_correction",
               "corrects the gap between the trainer's recomputed log-prob and the rollout's; with "
               "train.behaviour_logp=rollout the ratio already divides by the rollout's: set recompute")
        _check(self.is_band > 1.0, "train.is_band", f"must be > 1, got {self.is_band}")
        _check(self.is_correction != "none" or self.is_band == 2.0, "train.is_band",
               "bounds train.is_correction's weight, which is none: set truncated or mask, or leave it at 2.0")
        _one_of(self.loss, "train.loss", LOSS_KINDS)
        _one_of(self.grad_sum, "train.grad_sum", GRAD_SUMS)
        _check(self.loss != "nft" or self.clip_range == 1e-4, "train.clip_range",
               "DiffusionNFT has no ratio to clip: leave train.clip_range at its default 1e-4 with train.loss=nft")
        _check(self.lr > 0, "train.lr", "must be > 0")
        _check(self.clip_range > 0, "train.clip_range", "must be > 0")
        _check(self.beta >= 0, "train.beta", "must be >= 0")
        _check(self.max_grad_norm > 0, "train.max_grad_norm", "must be > 0")
        _check(0 <= self.ema_decay < 1, "train.ema_decay", "must be in [0, 1)")
        _check(self.tsp_chunk >= 0, "train.tsp_chunk", "must be >= 0")
        _check(self.backward_batch >= 0, "train.backward_batch", "must be >= 0 (0 = whole micro-batch)")
        _check(self.pairs_per_pass >= 0, "train.pairs_per_pass", "must be >= 0 (0 = one pass per trained step)")
        _check(self.pairs_per_pass == 0 or self.backward_batch == 0, "train.pairs_per_pass",
               "and train.backward_batch both size a pass: set one of them (pairs_per_pass counts "
               "(sample, trained step) pairs, backward_batch samples of one step)")

    def _check_awm(self) -> None:
        """The AWM keys act only with train.loss=awm; what AWM cannot act on is refused."""
        awm = self.loss == "awm"
        _check(self.awm_adv_max > 0, "train.awm_adv_max", "must be > 0")
        _check(self.awm_adv_max == 1.0 or awm, "train.awm_adv_max", "scales AWM's advantages: set train.loss=awm, or 1.0")
        _one_of(self.awm_weighting, "train.awm_weighting", AWM_WEIGHTINGS)
        _check(self.awm_weighting == "uniform" or awm, "train.awm_weighting",
               "weights AWM's flow-matching error: set train.loss=awm, or uniform")
        _check(self.awm_ghuber_power > 0, "train.awm_ghuber_power", "must be > 0")
        _check(self.awm_ghuber_power == 0.25 or (awm and self.awm_weighting == "ghuber"), "train.awm_ghuber_power",
               "is the power of train.awm_weighting=ghuber: set it (with train.loss=awm), or leave 0.25")
        if awm:
            _check(self.behaviour_logp == "rollout", "train.behaviour_logp",
                   "AWM trains on clean samples, without a rollout log-prob: leave it at rollout with train.loss=awm")
            _check(self.is_correction == "none", "train.is_correction",
                   "AWM has no rollout log-prob to correct: leave it at none with train.loss=awm")
            # one optimizer step per RL step: the old policy is the live one, the ratio 1 in value
            # (the authors' on-policy runs, train_sd3_awm.py:1282-1284, set clip_range 1: it never acts)
            _check(self.clip_range == 1e-4, "train.clip_range",
                   "AWM's ratio is 1 in value here (its old policy is the step's own weights): "
                   "leave train.clip_range at its default 1e-4 with train.loss=awm")

    def _check_dpo(self) -> None:
        """The keys of train.loss=dpo and flow-dppo: each acts only with its loss, and the keys
        those losses have no use for are refused, named."""
        _one_of(self.dpo_pairs, "train.dpo_pairs", DPO_PAIRS)
        _check(self.dpo_beta > 0, "train.dpo_beta", "must be > 0")
        _check(self.dpo_margin >= 0, "train.dpo_margin", "must be >= 0")
        _check(self.kl_mask_threshold > 0, "train.kl_mask_threshold", "must be > 0")
        dpo = self.loss == "dpo"
        for key, default in (("dpo_beta", 100.0), ("dpo_pairs", "best-worst")):
            _check(dpo or getattr(self, key) == default, f"train.{key}",
                   f"shapes online Diffusion-DPO; train.loss={self.loss}: set train.loss=dpo, or leave it at its default")
        _check(self.dpo_margin == 0 or (dpo and self.dpo_pairs == "margin"), "train.dpo_margin",
               "is the advantage gap of train.dpo_pairs=margin (with train.loss=dpo): set those, or leave it at 0")
        _check(self.kl_mask_threshold == 1e-5 or self.loss == "flow-dppo", "train.kl_mask_threshold",
               f"is Flow-DPPO's trust region; train.loss={self.loss}: set train.loss=flow-dppo, or leave it at 1e-5")
        if dpo:
            _check(self.beta == 0, "train.beta", "is the KL weight; Diffusion-DPO is anchored to its reference by "
                   "its own loss (train.dpo_beta): leave it at 0 with train.loss=dpo")
            _check(self.backward_batch == 0, "train.backward_batch",
                   "cuts a Train unit's rows, and a DPO pair must be trained in one pass: leave it at 0 with train.loss=dpo")
        if self.loss in ("dpo", "flow-dppo"):
            _check(self.clip_range == 1e-4, "train.clip_range",
                   f"{self.loss} has no ratio clip: leave train.clip_range at its default 1e-4")
        if dpo:
            _check(self.behaviour_logp == "rollout", "train.behaviour_logp",
                   "Diffusion-DPO trains on clean samples, without a log-prob ratio: leave it at rollout")
            _check(self.is_correction == "none", "train.is_correction",
                   "Diffusion-DPO has no log-prob ratio to correct: leave it at none")

    def _check_nft_old_policy(self) -> None:
        """The DiffusionNFT old-policy keys: each acts only with train.loss=nft and a kept old
        policy, and is refused, named, otherwise."""
        _check(0 <= self.nft_decay < 1, "train.nft_decay", f"must be in [0, 1), got {self.nft_decay}")
        _check(self.nft_decay == 0 or self.loss == "nft", "train.nft_decay",
               f"keeps DiffusionNFT's old policy; train.loss={self.loss} has none: set train.loss=nft, or 0")
        _check(self.nft_decay_rate > 0, "train.nft_decay_rate", "must be > 0")
        _check(self.nft_decay_flat >= 0, "train.nft_decay_flat", "must be >= 0")
        for key, default in (("nft_decay_rate", 0.001), ("nft_decay_flat", 0)):
            _check(getattr(self, key) == default or self.nft_decay > 0, f"train.{key}",
                   "shapes the old-policy decay, which train.nft_decay 0 turns off: set train.nft_decay > 0, "
                   "or leave it at its default")
        _check(self.nft_beta > 0, "train.nft_beta", "must be > 0")
        _check(self.nft_beta == 1.0 or self.nft_decay > 0, "train.nft_beta",
               "with train.nft_decay 0 the old policy is the policy being trained, and DiffusionNFT's gradient "
               "does not depend on beta (tests/math/test_nft.py): set train.nft_decay > 0, or leave it at 1")


@dataclass
class RunConfig:
    """The run: its mode, seed, folder, evaluation and checkpoint cadence, loggers."""

    # every random draw (prompts, initial noise, SDE noise) is a function of (seed, RL step, group,
    # sample, denoising step), never of which worker ran it
    seed: int = 0
    run_dir: str = "runs/default"  # where checkpoints, metrics, config.json, traces and samples go
    # local: the single-device trainer, no Ray; every other mode runs on Ray with the scheduler
    # (docs/runtime.md "Modes", docs/glossary.md)
    mode: str = "digenrl"
    # TCSS, the opt-in bounded staleness of the RFC: while the trainers finish a step, rollout
    # may start the next step's micro-batches with the previous weights, at most this fraction
    # of them (rounded up; the RFC's curve offers 0.5); every trajectory keeps one version, at
    # most one behind. 0 = off: strict on-policy step boundaries. GAP modes only.
    tcss_fraction: float = 0.0
    eval_every: int = 10  # held-out evaluation every this many RL steps (0 = only before and after)
    checkpoint_every: int = 10  # a checkpoint every this many RL steps (0 = only at the end)
    keep_checkpoints: int = 2  # the newest this many checkpoints are kept; older ones are deleted
    # torch intra-op threads of the run.mode=local process; 0 = torch's default. Ray modes
    # refuse it: each worker process takes runtime.worker_threads instead.
    threads: int = 0
    # where step metrics go besides metrics.jsonl: any of LOGGERS (digenrl/io/outputs.py,
    # digenrl/io/loggers.py); [] = metrics.jsonl only
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    # the older switch, kept for configs that set it: false drops tensorboard from
    # run.loggers, true requires it there; folded into run.loggers at construction (-> None)
    tensorboard: Optional[bool] = None
    wandb_project: str = "digenrl"  # wandb only: the project the run is logged under
    # wandb only: online | offline | disabled; None = wandb's own choice ($WANDB_MODE, else online)
    wandb_mode: Optional[str] = None

    def __post_init__(self) -> None:
        _one_of(self.mode, "run.mode", MODES)
        _check(0.0 <= self.tcss_fraction <= 1.0, "run.tcss_fraction",
               "must be in [0, 1] (0 = TCSS off, 0.5 = the RFC's setting, 1 = any micro-batch may start stale)")
        _check(self.tcss_fraction == 0 or self.mode in GAP_MODES, "run.tcss_fraction",
               f"bounds staleness in the streaming modes ({', '.join(GAP_MODES)}); run.mode={self.mode} "
               "has no TCSS (one-step-off is the batch-level lag)")
        self._fold_loggers()
        _check(self.eval_every >= 0, "run.eval_every", "must be >= 0 (0 = only before and after)")
        _check(self.checkpoint_every >= 0, "run.checkpoint_every", "must be >= 0 (0 = only at the end)")
        _check(self.keep_checkpoints >= 1, "run.keep_checkpoints", "must be >= 1")
        _check(self.threads >= 0, "run.threads", "must be >= 0 (0 = torch's default)")
        _check(self.threads == 0 or self.mode == "local", "run.threads",
               f"sets the threads of the run.mode=local process only; with run.mode={self.mode} every "
               "Ray worker takes runtime.worker_threads: use that (and leave run.threads at 0)")

    def _fold_loggers(self) -> None:
        """Check run.loggers and fold the run.tensorboard alias into it."""
        for name in self.loggers:
            _one_of(name, "run.loggers", LOGGERS)
        _check(len(set(self.loggers)) == len(self.loggers), "run.loggers", f"names a logger twice: {self.loggers}")
        if self.tensorboard is False:
            self.loggers = [name for name in self.loggers if name != "tensorboard"]
        elif self.tensorboard is True:
            _check("tensorboard" in self.loggers, "run.tensorboard",
                   f"true contradicts run.loggers={self.loggers}; set run.loggers alone (run.tensorboard is "
                   "its older alias)")
        self.tensorboard = None
        if "wandb" not in self.loggers:
            _check(self.wandb_project == "digenrl", "run.wandb_project",
                   "names the wandb project, but run.loggers has no wandb: add it, or leave the key unset")
            _check(self.wandb_mode is None, "run.wandb_mode",
                   "sets wandb's mode, but run.loggers has no wandb: add it, or leave the key unset")
        if self.wandb_mode is not None:
            _one_of(self.wandb_mode, "run.wandb_mode", WANDB_MODES)
        _check(bool(self.wandb_project), "run.wandb_project", "must not be empty")


COMPUTE = ("real", "emulated")
PLAN = ("auto", "always", "never")  # not on/off: YAML reads those as booleans


@dataclass
class PoolConfig:
    """One worker pool: how many workers and what each one reserves on the Ray cluster."""

    workers: int = 1  # workers (scheduler workers, each a gang of `gang` ranks) in this pool
    num_cpus: float = 1.0  # CPUs each rank reserves on the Ray cluster
    num_gpus: float = 0.0  # GPUs each rank reserves (fractions share a GPU); 0 = CPU only
    accelerator: Optional[str] = None  # Ray accelerator_type, e.g. "H200" or "L40S" (heterogeneous clusters)
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources, e.g. node labels
    # ranks (Ray actors, one device each) per worker, which run each unit together (SPMD).
    # Trainer pool: the devices one sharded model spans (shard=fsdp). Rollout pool: the
    # sequence-parallel degree; the gang runs each trajectory whole, every rank on its slice of
    # the tokens, full weights on each rank. Reward pool: 1
    gang: int = 1
    # trainer pool only: fsdp = FSDP2 over the gang's devices, gradients all-reduced across
    # gangs once per RL step (HSDP); none = every rank holds the whole model
    shard: str = "none"
    # trainer pool, shard=fsdp: after-forward frees the gathered parameters after each forward
    # (ZeRO-3); after-step keeps them for the whole RL step (one gather per step)
    reshard: str = "after-forward"
    offload: bool = False  # trainer pool, shard=fsdp: AdamW state on the host (FSDP2 CPU offload)
    # trainer pool: sequence-parallel degree inside the gang (Ulysses; video families): sp ranks
    # run the same rows, each on its slice of the video tokens (digenrl/models/sequence_parallel.py)
    sp: int = 1
    # rollout pool only: spot (preemptible) workers (docs/runtime.md "Spot rollout workers"). A
    # notice (SIGTERM to a worker's process, a file in `notices`, or the `preemptions` trace)
    # drains the worker before its deadline; past the deadline it is killed and its work
    # regenerated as a lost node's
    preemptible: bool = False
    notice_s: float = 30.0  # preemptible: seconds to the deadline when a notice gives none (SIGTERM, an empty file)
    # preemptible: the directory where a file named after a worker is its notice (its content:
    # empty, seconds, or AWS's instance-action JSON); None = RUN_DIR/notices
    notices: Optional[str] = None
    # preemptible: a sched.preemption trace (JSON lines of notices and joins, seconds from the
    # run's start; emulated compute: modelled seconds) sent on the run's clock; a join starts a
    # rollout worker. The simulator reads the same file
    preemptions: Optional[str] = None
    # rollout pool: ask Ray's autoscaler (ray.autoscaler.sdk.request_resources) for room for up
    # to this many workers, and add workers as nodes appear; 0 = off (the pool stays `workers`)
    max_workers: int = 0
    # trainer pool, modes where trainers generate (TAG modes, colocated): at each switch to
    # generation (runtime/tag_switch.py), when gradients have accumulated, move AdamW state,
    # gradients, float64 gradient sums and (full fine-tune) the trainable weights to the host
    # and restore them bit for bit afterwards. auto: when the rank's memory in use plus the
    # last generation's peak exceeds the usable device memory (sim/memory.py's rule; never on
    # a CPU); always; never. A sharded gang's ranks move their shards; its masters stay (the
    # generation gathers them). Counted: tag/* step metrics
    tag_offload: str = "auto"
    # preemptible: the cloud whose metadata service a watcher on each node with spot workers polls
    # (aws: IMDSv2 spot/instance-action; gce: instance/preempted; azure: Scheduled Events), its
    # answer written as the notice of every worker on that node (runtime/cloud_notices.py); None = off
    watch: Optional[str] = None
    # watch: the metadata service's base URL; None = the cloud's (http://169.254.169.254, GCE's
    # http://metadata.google.internal). "{node_id}" / "{node_ip}" in it: the watcher's node
    metadata_url: Optional[str] = None
    watch_poll_s: float = 2.0  # watch: seconds between polls (gce: the longest a wait_for_change hangs)

    def check(self, key: str, minimum: int) -> None:
        _check(self.workers >= minimum, f"{key}.workers", f"must be >= {minimum}, got {self.workers}")
        _check(self.num_cpus >= 0 and self.num_gpus >= 0, key, "num_cpus and num_gpus must be >= 0")
        _check(self.gang >= 1, f"{key}.gang", f"must be >= 1 (devices per worker), got {self.gang}")
        _one_of(self.shard, f"{key}.shard", SHARD_KINDS)
        _one_of(self.reshard, f"{key}.reshard", RESHARD_KINDS)
        _one_of(self.tag_offload, f"{key}.tag_offload", TAG_OFFLOAD)
        _check(not self.offload or self.shard == "fsdp", f"{key}.offload",
               "offloads the sharded optimizer state: needs shard=fsdp")

    def _not_spot(self, key: str, why: str) -> None:
        """Refuse the rollout-only keys (spot workers, autoscaling) on another pool."""
        for name in SPOT_KEYS:
            _check(getattr(self, name) == getattr(PoolConfig, name), f"{key}.{name}",
                   f"only the rollout pool is preemptible or autoscaled: {why}")

    def check_trainer(self, key: str) -> None:
        self.check(key, 1)
        self._not_spot(key, "a trainer holds gradient and optimizer state that a reclaim would lose")
        _check(self.gang == 1 or self.shard == "fsdp", f"{key}.shard",
               f"a gang of {self.gang} devices trains one sharded model: set shard=fsdp (or gang=1)")
        _check(self.sp >= 1 and self.gang % self.sp == 0, f"{key}.sp",
               f"the sequence-parallel degree must divide {key}.gang={self.gang}, got {self.sp}")

    def _trainer_only(self, key: str) -> None:
        _check(self.tag_offload == "auto", f"{key}.tag_offload",
               "acts on a trainer's switches to generation: a runtime.trainer key")

    def check_rollout(self, key: str) -> None:
        """The rollout pool: a gang is a sequence-parallel group (full weights on every rank)."""
        self.check(key, 0)
        self._trainer_only(key)
        _check(self.shard == "none" and not self.offload and self.reshard == "after-forward", f"{key}.shard",
               "only the trainer pool shards (shard, reshard, offload are trainer keys)")
        _check(self.sp == 1, f"{key}.sp", f"a rollout gang's sequence-parallel degree is {key}.gang; leave sp at 1")
        _check(math.isfinite(self.notice_s) and self.notice_s >= 0, f"{key}.notice_s",
               f"must be a finite number of seconds >= 0, got {self.notice_s}")
        if self.watch is not None:
            _one_of(self.watch, f"{key}.watch", WATCH_CLOUDS)
        _check(math.isfinite(self.watch_poll_s) and self.watch_poll_s > 0, f"{key}.watch_poll_s",
               f"must be a finite number of seconds > 0, got {self.watch_poll_s}")
        _check(self.metadata_url is None or self.metadata_url.startswith(("http://", "https://")),
               f"{key}.metadata_url", f"must be an http(s):// URL, got {self.metadata_url!r}")
        _check(self.watch is not None or (self.metadata_url is None and self.watch_poll_s == PoolConfig.watch_poll_s),
               f"{key}.metadata_url" if self.metadata_url is not None else f"{key}.watch_poll_s",
               f"belongs to the metadata watcher: set {key}.watch to one of {', '.join(WATCH_CLOUDS)}")
        if not self.preemptible:
            for name in ("notice_s", "notices", "preemptions", "watch"):
                _check(getattr(self, name) == getattr(PoolConfig, name), f"{key}.{name}",
                       f"acts on spot workers only: set {key}.preemptible=true")
        if self.preemptions:
            from digenrl.sched.preemption import read_trace

            try:
                read_trace(self.preemptions)
            except (OSError, ValueError) as e:
                raise ConfigError(f"{key}.preemptions: {e}") from None
        for name in ("preemptible", "max_workers"):  # both add rollout workers mid-run (joins, nodes)
            _check(self.workers >= 1 or not getattr(self, name), f"{key}.{name}",
                   f"a run that starts without rollout workers publishes no weights for any that join: "
                   f"set {key}.workers >= 1")
        _check(self.max_workers == 0 or self.max_workers >= max(self.workers, 1), f"{key}.max_workers",
               f"is the pool's upper bound: 0 (no autoscaling) or >= {key}.workers={self.workers} (and >= 1), "
               f"got {self.max_workers}")

    def check_single(self, key: str) -> None:
        """The reward pool: one device per worker, no sharding."""
        self.check(key, 0)
        self._trainer_only(key)
        self._not_spot(key, "the reward pool neither drains on a notice nor scales")
        _check(self.gang == 1 and self.sp == 1, f"{key}.gang", "reward workers are one device each; set 1")
        _check(self.shard == "none" and not self.offload and self.reshard == "after-forward", f"{key}.shard",
               "only the trainer pool shards (shard, reshard, offload are trainer keys)")


@dataclass
class RuntimeConfig:
    """The Ray runtime (every run.mode except local)."""

    address: Optional[str] = None  # an existing cluster; None = $RAY_ADDRESS, else start a local one
    # colocated: one pool of rollout.workers + trainer.workers devices that generate and
    # train (rollout.workers may be 0); TAG modes may run without a rollout pool too.
    rollout: PoolConfig = field(default_factory=lambda: PoolConfig(workers=2))
    trainer: PoolConfig = field(default_factory=lambda: PoolConfig(workers=1))
    reward: PoolConfig = field(default_factory=lambda: PoolConfig(workers=0))  # 0 = on the generating worker
    # object-store | lora-only (adapters only) | nccl: trainer 0's relay sends each rollout pull
    # point-to-point over a process group (NCCL on GPU, gloo on CPU; runtime/relay.py)
    weight_sync: str = "object-store"
    # the network interface (e.g. eth0, ib0, bond0) that gloo and NCCL collectives and the weight
    # relay use on every node: each actor gets GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, and
    # process-group and relay addresses are that interface's IPv4 address. None = Ray's node IP
    # and the libraries' own choice (docs/runtime.md "Networks")
    network_interface: Optional[str] = None
    # real: workers load the model and compute; emulated: real Ray actors that sleep for the
    # cost model's time of each unit (no model or reward is loaded); the
    # schedule (pools, data shape, shards, segments) is this config's, the hardware and the
    # model's costs are the testbed's (digenrl.sim.workload)
    compute: str = "real"
    testbed: Optional[str] = None  # emulated: a testbed preset or YAML file (hardware, links, costs)
    time_scale: float = 1.0  # emulated: wall seconds per modelled second
    # TAG (trainer-assisted generation): denoising steps a trainer generates before it checks
    # for training work (and, if there is some, hands the partial trajectory to a rollout worker)
    tag_segment: int = 1
    # TAG: a trainer with training work ready at a segment boundary hands its partial trajectory
    # to a rollout worker (true), or finishes the trajectory first (false: no mid-trajectory switch)
    tag_handback: bool = True
    rollout_segment: int = 0  # denoising steps per rollout Generate unit; 0 = whole trajectory
    gen_shard: int = 1  # Generate units per micro-batch along the sample axis (1 = whole micro-batch)
    train_shard: int = 1  # Train units per (micro-batch, TSP (time-step parallelism) chunk) along the sample axis (1 = off)
    worker_threads: int = 1  # torch intra-op threads per Ray worker process (run.threads is local mode's)
    # Plan the run at hand (digenrl.sim.here): time each unit kind on this cluster, then pick
    # the pool split (same total), data.micro_batch_groups and train.tsp_chunk that the
    # config does not set. auto: only when the config file and overrides give no pool size;
    # always: also when they do (then the split stays); never. A Config built in code counts
    # as all given.
    plan: str = "auto"
    # RL steps of each probe: runtime.plan runs the config as given and the best other
    # candidates this many steps on their own actors (no evaluation, no checkpoint; in
    # <run_dir>/probes/N) to measure what the runtime adds to each unit: per unit kind, how much
    # longer it takes than its profiled compute, and the gap before the next unit
    # (digenrl.sim.here.RuntimeCosts); the first step (warm-up) and the last (drain) are not
    # measured. 0 = no probe: the plan prices the profiled compute only. None = 4 where the
    # workers share a machine's CPU cores, 0 where each holds a GPU (a probe there loads the
    # model again and runs whole steps: set it to probe GPU pools)
    plan_probe_steps: Optional[int] = None
    # Deadlines of the driver's waits (docs/runtime.md, "Waits and their deadlines"): a passed
    # one stops the run naming what it waited for. This one: seconds a worker (first placement,
    # replacement, elastic addition, the planning profile) may wait for the resources it asks
    # for; the message names those the cluster lacks
    placement_timeout_s: float = 120.0
    # seconds placed workers may take to come up and get ready (model and rewarder load,
    # process groups, checkpoint load, initial weights), and for the final weights
    start_timeout_s: float = 1800.0
    # seconds the event loop may go without any unit finishing before it stops the run
    # with the scheduler's state (a watchdog: raise it for units longer than that); also
    # the end-of-run wait for evaluations and checkpoint saves
    stall_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        self.rollout.check_rollout("runtime.rollout")
        self.trainer.check_trainer("runtime.trainer")
        self.reward.check_single("runtime.reward")
        _one_of(self.weight_sync, "runtime.weight_sync", WEIGHT_SYNC_METHODS)
        _one_of(self.compute, "runtime.compute", COMPUTE)
        _one_of(self.plan, "runtime.plan", PLAN)
        _check(self.plan_probe_steps in (None, 0) or self.plan_probe_steps >= 3, "runtime.plan_probe_steps",
               "must be 0 (no probe) or >= 3 (the first step warms the actors up and the last drains: "
               "neither is measured)")
        _check(self.compute != "emulated" or bool(self.testbed), "runtime.testbed",
               "compute=emulated needs a testbed (file or preset) whose cost model the workers sleep for")
        _check(self.time_scale > 0, "runtime.time_scale", "must be > 0")
        _check(self.tag_segment >= 1, "runtime.tag_segment", "must be >= 1")
        _check(self.rollout_segment >= 0, "runtime.rollout_segment", "must be >= 0 (0 = whole trajectory)")
        _check(self.gen_shard >= 1, "runtime.gen_shard", "must be >= 1 (1 = unsharded)")
        _check(self.train_shard >= 1, "runtime.train_shard", "must be >= 1 (1 = unsharded)")
        _check(self.worker_threads >= 1, "runtime.worker_threads", "must be >= 1")
        _check(self.network_interface is None or bool(re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", str(self.network_interface))),
               "runtime.network_interface", f"an interface name as `ip link` lists it (e.g. eth0, ib0), "
               f"got {self.network_interface!r}")
        for key in ("placement_timeout_s", "start_timeout_s", "stall_timeout_s"):
            _check(getattr(self, key) > 0, f"runtime.{key}", "must be > 0 (seconds)")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        mode, rt = self.run.mode, self.runtime
        if rt.compute == "real":  # emulated compute loads no model and no reward
            self._check_weights()
        # Batch-level modes (and local) train nothing before the whole step is rewarded.
        whole_step = mode == "local" or mode in BATCH_MODES
        _check(
            whole_step or self.reward.adv_std != "global",
            "reward.adv_std",
            f"'global' needs every reward of the step before any training, which run.mode={self.run.mode} "
            "streams past; use group or none, or mode local/" + "/".join(BATCH_MODES),
        )
        _check(not self.sampling.rollout_dtype or self.model.dtype == "float32", "sampling.rollout_dtype",
               f"runs the rollout below the trainer's float32; with model.dtype={self.model.dtype} both already "
               "compute at that precision: leave it empty")
        _check(
            self.runtime.weight_sync != "lora-only" or self.model.lora_rank > 0,
            "runtime.weight_sync",
            "lora-only sends adapters only: set model.lora_rank > 0",
        )
        self._check_pairs_whole()
        _check(not (self.data.micro_batch_samples and self.reward.aggregate == "gdpo"), "reward.aggregate",
               "gdpo standardises each reward within its prompt group on the micro-batch that holds it, and "
               "data.micro_batch_samples cuts groups; use sum, or whole groups (data.micro_batch_groups)")
        self._check_ray_only()
        _check(rt.plan != "always" or rt.compute == "real", "runtime.plan",
               "always plans a Ray run on real compute; emulated compute has nothing to plan (use auto or never)")
        _check(rt.plan_probe_steps in (None, 0) or (rt.plan != "never" and rt.compute == "real"),
               "runtime.plan_probe_steps", "sizes runtime.plan's probes of a Ray run on real compute; with "
               f"runtime.plan={rt.plan} and runtime.compute={rt.compute} nothing is planned: leave it unset")
        _check(whole_step or not self.data.micro_batch_samples,
               "data.micro_batch_samples",
               f"cuts prompt groups, which run.mode={mode} streams to training before the group's "
               "advantages exist; use data.micro_batch_groups, or mode local/" + "/".join(BATCH_MODES))
        if rt.trainer.shard == "fsdp":
            _check(not self.model.device.startswith("cuda") or rt.trainer.num_gpus >= 1, "runtime.trainer.num_gpus",
                   "each rank of a sharded gang needs a GPU of its own (NCCL refuses two ranks on one GPU); set >= 1")
            _check(self.model.dtype != "float16", "model.dtype",
                   "sharded trainers compute in bfloat16 or float32 (fp32 master weights); float16 would need "
                   "loss scaling, which is not built")
            _check(self.train.loss != "dpo" or self.model.lora_rank > 0, "train.loss",
                   "dpo needs its reference, and one for a sharded full fine-tune (a second sharded copy of "
                   "the base model) is not built: use LoRA (the reference is the adapters switched off)")
            _check(self.train.beta == 0 or self.model.lora_rank > 0, "train.beta",
                   "a KL reference for a sharded full fine-tune (a second sharded copy of the base model) is not "
                   "built; use LoRA (the reference is the adapters switched off) or beta 0")
            # each rank routes its own rows to an expert by sigma, so ranks would all-gather different
            # experts' shards and the collectives would not pair up
            _check(self.model.name not in TWO_EXPERTS, "runtime.trainer.shard",
                   f"fsdp is not built for two-expert families ({self.model.name}); use shard=none")
        if rt.rollout.gang > 1 or rt.trainer.sp > 1:
            key = "runtime.rollout.gang" if rt.rollout.gang > 1 else "runtime.trainer.sp"
            _check(self.model.name in SP_FAMILIES, key,
                   f"sequence parallelism splits video tokens: model.name must be one of {', '.join(SP_FAMILIES)}, "
                   f"got {self.model.name}")
        if mode != "local":
            _check(rt.rollout.workers >= 1 or mode == "colocated" or mode in TAG_MODES,
                   "runtime.rollout.workers",
                   f"run.mode={mode} needs at least one rollout worker (only colocated and the TAG "
                   "modes generate on trainers)")
        _check(rt.trainer.tag_offload == "auto" or mode == "colocated" or mode in TAG_MODES,
               "runtime.trainer.tag_offload",
               f"acts when a trainer generates, and under run.mode={mode} no trainer does (only colocated and the "
               f"TAG modes {', '.join(TAG_MODES)}): leave it at auto")
        if mode == "colocated":
            for name in SPOT_KEYS:
                _check(getattr(rt.rollout, name) == getattr(PoolConfig, name), f"runtime.rollout.{name}",
                       "run.mode=colocated has no rollout pool: every worker trains, and a trainer's state "
                       "cannot be reclaimed")
        if rt.compute == "emulated":
            _check(rt.rollout.max_workers == 0, "runtime.rollout.max_workers",
                   "emulated workers ask for no nodes, so there is nothing to autoscale; spot replacements "
                   "come from the joins of runtime.rollout.preemptions")
            _check(rt.reward.workers == 0, "runtime.reward.workers",
                   "emulated compute models rewards on the generating worker; set 0")
            _check(rt.rollout.watch is None, "runtime.rollout.watch",
                   "emulated workers run on no cloud's machine; their notices come from runtime.rollout.preemptions")
            _check(rt.network_interface is None, "runtime.network_interface",
                   "emulated workers sleep and run no collectives or relay; leave it unset")
        # model.device=cuda on Ray: every pool that loads the policy must reserve a GPU. A Ray
        # actor with num_gpus 0 sees no GPU (CUDA_VISIBLE_DEVICES is empty) and would fail on
        # its first CUDA call, after Ray and the other workers started. Emulated compute loads
        # no model; colocated runs every policy worker with the trainer pool's options.
        if self.model.device.startswith("cuda") and self.run.mode != "local" and rt.compute != "emulated":
            for name in ["trainer"] if self.run.mode == "colocated" else ["rollout", "trainer"]:
                pool = getattr(rt, name)
                _check(pool.workers == 0 or pool.num_gpus > 0, f"runtime.{name}.num_gpus",
                       f"is 0, but model.device={self.model.device} with run.mode={self.run.mode} loads the "
                       f"policy on every {name} worker: set runtime.{name}.num_gpus=1 (or model.device=cpu)")
        _check(self.sampling.sigmas == "digenrl" or self.model.name != "tiny-dit", "sampling.sigmas",
               "diffusers builds a diffusers pipeline's grid; tiny-dit has no pipeline: use digenrl")
        _check(self.sampling.sigmas == "digenrl" or self.model.name in ("tiny-dit", *GRID_FAMILIES),
               "sampling.sigmas", f"the diffusers grid is not built for {self.model.name} (only for "
               f"{', '.join(GRID_FAMILIES)}): use digenrl")
        # Wan2.1's UniPC flow sigmas start at 1 - 1e-6, where flow-sde's std sqrt(s / (1 - s))
        # is ~1000 x noise_level (flow_grpo's Wan sampler uses another noise schedule there,
        # wan_pipeline_with_logprob.py:44-52, which no sampling.sde kind implements)
        s = self.sampling
        _check(s.cfg_scale_low == 0 or self.model.name in TWO_EXPERTS, "sampling.cfg_scale_low",
               f"{self.model.name} has one transformer (only {', '.join(TWO_EXPERTS)} have a low-noise expert): "
               "leave it at 0 (sampling.cfg_scale guides every step)")
        # SANA's DPM-Solver flow sigmas start at 0.9997 (flow_shift 3, 10 steps): std ~58 x noise_level;
        # Cosmos-Predict2.5's UniPC Karras flow sigmas at 200/201 = 0.995: std ~14 x noise_level
        _check(not (s.sigmas == "diffusers" and self.model.name in ("wan", "wan-i2v", "sana", "sana-video",
                                                                    "cosmos-predict2.5")
                    and s.sde == "flow-sde"),
               "sampling.sigmas",
               f"diffusers on {self.model.name} starts just below sigma 1 (wan: 1 - 1e-6, sana: 0.9997, "
               "cosmos-predict2.5: 0.995), where flow-sde's noise explodes (std ~ 1000 / ~58 / ~14 x noise_level); "
               "use sigmas=digenrl with flow-sde, or another sampling.sde")
        # an ODE rollout records no log-probs: only DiffusionNFT trains on it
        _check(s.sde != "ode" or self.train.loss in CLEAN_SAMPLE_LOSSES, "sampling.sde",
               f"ode records no log-probs for train.loss={self.train.loss} to train on: use an SDE kind "
               "(flow-sde, dance-sde, cps), or train.loss=nft, dpo or awm (they train on the clean samples)")
        # RatioNorm undoes the Gaussian log-ratio's drift -|d mean|^2 / (2 std^2); cps scores
        # the surrogate -|x' - mean|^2, which has no std to normalise by
        _check(self.train.loss not in ("grpo-guard", "flow-dppo") or s.sde in ("flow-sde", "dance-sde"),
               "train.loss", f"{self.train.loss} measures a Gaussian step (RatioNorm, Flow-DPPO's divergence); "
               f"sampling.sde={s.sde} scores a surrogate: use sampling.sde=flow-sde or dance-sde, or train.loss=grpo")
        # a per-sample draw among the SDE steps needs every step but the last to be SDE
        _check(s.window_draw == "step" or self.train.loss in CLEAN_SAMPLE_LOSSES or s.window in ("all-but-last", "fraction"),
               "sampling.window_draw",
               f"sample draws each sample's trained steps among all SDE steps; sampling.window={s.window} "
               "samples only its window with the SDE: use window fraction or all-but-last, or window_draw=step")
        self._check_conditioning()
        # DiffusionNFT's old policy swaps its shadows into the sharded parameters; reshard=after-step
        # keeps the gathered (live) copies between forwards, which would then not see the swap
        _check(not (self.train.nft_decay > 0 and rt.trainer.shard == "fsdp" and rt.trainer.reshard == "after-step"),
               "train.nft_decay", "swaps the old policy into the sharded parameters, which "
               "runtime.trainer.reshard=after-step keeps gathered between forwards: use reshard=after-forward")
        if self.model.name == "tiny-dit":
            for name in self.reward.weights:
                _check(
                    name != "toy-geneval" or self.data.prompts == "toy",
                    "reward.weights.toy-geneval",
                    "judges toy-world prompts only: set data.prompts=toy",
                )

    def _check_pairs_whole(self) -> None:
        """train.loss=dpo draws its pairs within a prompt group, so every Train unit must hold
        whole groups: the settings that cut one are refused, named."""
        if self.train.loss != "dpo":
            return
        _check(not self.data.micro_batch_samples, "data.micro_batch_samples",
               "cuts prompt groups, and train.loss=dpo pairs samples within a group in one Train unit: "
               "use data.micro_batch_groups")
        _check(self.runtime.train_shard == 1, "runtime.train_shard",
               "cuts a micro-batch's prompt groups across Train units, and train.loss=dpo pairs samples "
               "within a group in one unit: leave it at 1")
        _check(self.data.group_size >= 2, "data.group_size", "train.loss=dpo pairs samples of a prompt group: set >= 2")

    def _check_ray_only(self) -> None:
        """run.mode=local runs one process without Ray: the one place that refuses the runtime
        keys only a Ray run reads (each named, with what it would do)."""
        if self.run.mode != "local":
            return
        rt = self.runtime
        for key, is_set, what in (
            ("runtime.plan", rt.plan == "always", "always plans a Ray run (use auto or never)"),
            ("runtime.compute", rt.compute == "emulated", "emulated compute sleeps on Ray actors"),
            ("runtime.rollout.gang", rt.rollout.gang > 1, "sequence-parallel gangs are Ray workers"),
            ("runtime.trainer.sp", rt.trainer.sp > 1, "sequence-parallel gangs are Ray workers"),
            ("runtime.network_interface", rt.network_interface is not None,
             "names the interface of the Ray actors' collectives and relay"),
            *((f"runtime.rollout.{k}", getattr(rt.rollout, k) != getattr(PoolConfig, k),
               "spot rollout workers and autoscaling act on Ray pools") for k in SPOT_KEYS),
            *((f"runtime.{k}", getattr(rt, k) != getattr(RuntimeConfig, k), "bounds a wait of the Ray driver")
              for k in ("placement_timeout_s", "start_timeout_s", "stall_timeout_s")),
            ("runtime.plan_probe_steps", rt.plan_probe_steps is not None,
             "sizes runtime.plan's probes, short runs of a Ray run's candidates"),
        ):
            _check(not is_set, key, f"{what}; run.mode=local runs one process without Ray: pick a Ray mode")

    def _check_conditioning(self) -> None:
        """A conditioned family reads a conditioning image per prompt: both prompt lists are
        .jsonl rows (whether their rows carry images, and whether an unconditioned family's
        rows do not, is read from the files by digenrl/tools/preflight.py and the trainer); a reward
        that compares with the source needs one; a reward that scores audio (AUDIO_REWARDS) needs
        a family that generates it (AUDIO_FAMILIES)."""
        from digenrl.data import ROWS_SUFFIX
        from digenrl.models.diffusers_adapters import AUDIO_FAMILIES, VIDEO_FAMILIES
        from digenrl.rewards import AUDIO_REWARDS, SOURCE_REWARDS, VIDEO_REWARDS

        kind = CONDITIONING.get(self.model.name)
        if kind is not None:
            rows = f'a {ROWS_SUFFIX} file of {{"prompt": ..., "image": ...}} rows'
            _check(self.data.prompts.endswith(ROWS_SUFFIX), "data.prompts",
                   f"{self.model.name} is conditioned on a {kind} per prompt: give {rows}")
            _check(self.data.held_out_prompts().endswith(ROWS_SUFFIX), "data.eval_prompts",
                   f"{self.model.name} is conditioned on a {kind} per prompt: give {rows} "
                   f"(the held-out rows; 'auto' has no images)")
        for name in self.reward.weights:
            _check(name not in SOURCE_REWARDS or kind is not None, f"reward.weights.{name}",
                   f"compares each sample with its source image; {self.model.name} has none "
                   f"(conditioned families: {', '.join(CONDITIONING)})")
        for name in self.reward.weights:  # audio and video rewards need a family that generates them
            _check(name not in AUDIO_REWARDS or self.model.name in AUDIO_FAMILIES, f"reward.weights.{name}",
                   f"scores the generated audio; {self.model.name} generates none "
                   f"(families with audio: {', '.join(AUDIO_FAMILIES)})")
            _check(name not in VIDEO_REWARDS or self.model.name in VIDEO_FAMILIES, f"reward.weights.{name}",
                   f"scores videos; {self.model.name} generates images (video families: {', '.join(VIDEO_FAMILIES)})")

    def _check_weights(self) -> None:
        from digenrl.rewards import BUILTIN_REWARDS

        m = self.model
        _check(m.name == "tiny-dit" or bool(m.path), "model.path",
               f"{m.name} needs its weights: a local diffusers pipeline folder or a hub id in the HF cache")
        for name in self.reward.weights:
            _check(name in BUILTIN_REWARDS or name in self.reward.paths, f"reward.paths.{name}",
                   f"reward {name!r} loads a model: set reward.paths.{name}=<local model folder>"
                   + (" (remote: <url>#<served reward name>)" if name == "remote" else "")
                   + (" (vlm-judge: url=http://host:port&model=<served model>)" if name == "vlm-judge" else ""))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def given(self) -> Optional[frozenset]:
        """Dotted keys the YAML file or overrides set (e.g. 'runtime.rollout.workers'); None
        for a Config built in code (all of it is taken as given). runtime.plan leaves these
        as they are."""
        return getattr(self, "_given", None)

    def wants_plan(self) -> bool:
        """Does this run plan its knobs on the cluster at hand (runtime.plan)? auto: when the
        config file and overrides give no pool size; always: every knob they do not give."""
        rt = self.runtime
        if self.run.mode == "local" or rt.compute != "real" or rt.plan == "never":
            return False
        pools = {"runtime.rollout.workers", "runtime.trainer.workers"}
        return rt.plan == "always" or (self.given is not None and not pools & self.given)


# -- the schema, as `digenrl train --help-config` prints it -------------------------------
# A field's description is the comment written where it is declared: the comment lines
# directly above it, then the comment at the end of its line (as simple-parsing reads help).
# The code stays the one place a key is described; tests/test_config_schema.py fails on a
# field without one.
@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, e.g. "runtime.rollout.workers"
    type: str  # e.g. "int", "str or null", "dict[str, float]"
    default: Any  # Config()'s value (a pool's default is its own: runtime.rollout.workers = 2)
    description: str


def _field_comments(cls: type) -> dict[str, str]:
    """{field name: the comment written where `cls` declares it}."""
    import ast
    import inspect
    import io
    import tokenize

    source = inspect.getsource(cls)
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, the line holds only the comment)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, line = [], node.lineno - 1
            while line in comments and comments[line][1]:
                above.insert(0, comments[line][0])
                line -= 1
            trailing = comments.get(node.end_lineno)
            text = above + ([trailing[0]] if trailing and not trailing[1] else [])
            out[node.target.id] = " ".join(t for t in text if t)
    return out


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def config_keys(cfg: Optional["Config"] = None) -> list[KeyDoc]:
    """Every key of the schema with its type, default (`cfg`'s value; Config() if None) and
    description, in declaration order, a section's own keys before its subsections."""

    def walk(obj: Any, prefix: str) -> list[KeyDoc]:
        cls = type(obj)
        hints, notes, rows, sections = typing.get_type_hints(cls), _field_comments(cls), [], []
        for f in fields(cls):  # a section's own keys first, then its subsections
            value, key = getattr(obj, f.name), f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                sections += walk(value, key + ".")
            else:
                rows.append(KeyDoc(key, _type_name(hints[f.name]), value, notes.get(f.name, "")))
        return rows + sections

    return walk(cfg if cfg is not None else Config(), "")


def config_help(width: int = 100) -> str:
    """The text of `digenrl train --help-config`: every section with what it is for, then each
    of its keys as `key: type = default` and its description, wrapped."""
    import textwrap

    def value(v: Any) -> str:
        return yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()

    purpose = {}  # section -> its class docstring's first paragraph + the comment where it is declared
    for name, obj in _sections(Config()):
        notes = _field_comments(type(obj))
        for f in fields(obj):
            cls = type(getattr(obj, f.name))
            if dataclasses.is_dataclass(cls):
                doc = (cls.__doc__ or "").strip()
                doc = "" if doc.startswith(cls.__name__ + "(") else doc.split("\n\n")[0].replace("\n", " ")
                purpose[f"{name}.{f.name}".lstrip(".")] = " ".join(t for t in (doc, notes.get(f.name, "")) if t)
    lines, section = [], None
    for doc in config_keys():
        head = doc.key.rpartition(".")[0]
        if head != section:
            section = head
            lines += ["", f"{head}:"] + textwrap.wrap(purpose.get(head, ""), width, initial_indent="  ", subsequent_indent="  ")
        lines.append(f"  {doc.key}: {doc.type} = {value(doc.default)}")
        lines += textwrap.wrap(doc.description, width, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines[1:]) + "\n"


def _sections(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, dataclass instance) of every section of `obj`, itself included ("")."""
    out = [(prefix.rstrip("."), obj)]
    for f in fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _sections(value, f"{prefix}{f.name}.")
    return out


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        return _coerce(value, [a for a in args if a is not type(None)][0], key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if origin is list:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        _check(isinstance(value, (list, tuple)), key, f"expected a list, got {value!r}")
        return [_coerce(v, args[0], key) for v in value]
    if origin is dict:
        _check(isinstance(value, dict), key, f"expected a mapping, got {value!r}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        _check(isinstance(value, bool), key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        return str(value)
    return value


@functools.cache
def _type_hints(cls: type) -> dict:
    """typing.get_type_hints of a config dataclass, once per class (the simulator's planner builds
    a Config per candidate point: 19,286 calls, 4.7 s of a 64-GPU `digenrl simulate`)."""
    return typing.get_type_hints(cls)


# Keys that were renamed: a config that still sets one is told the new name, not just "unknown".
RENAMED = {
    "reward.combine": "renamed reward.aggregate: weighted is now sum, normalized is now gdpo (GDPO's "
                      "per-group standardisation; its batch normalisation is reward.adv_std=global)",
}


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    _check(isinstance(data, dict), prefix or "config", f"expected a mapping, got {data!r}")
    hints = _type_hints(cls)
    names = [f.name for f in fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else k
        _check(k in names, key, RENAMED.get(key, f"unknown key; allowed keys here: {', '.join(names)}"))
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        _check(isinstance(node, dict), dotted, "cannot set a key inside a non-mapping value")
    node[parts[-1]] = value


def with_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """A copy of `cfg` with dotted-key overrides (typed values, e.g. {"train.lr": 3e-4})
    applied and validated as load_config validates."""
    tree = cfg.to_dict()
    for key, value in overrides.items():
        _set_dotted(tree, key, value)
    return load_config(None, tree=tree)


def dotted_get(tree: dict, key: str) -> Any:
    """tree["runtime"]["rollout"]["workers"] for key "runtime.rollout.workers"."""
    for part in key.split("."):
        tree = tree[part]
    return tree


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None, *,
                tree: Optional[dict] = None) -> Config:
    """Defaults <- YAML file (or `tree`, the same mapping in memory) <- key=value overrides
    (values parsed as YAML scalars)."""
    tree = copy.deepcopy(tree) if tree else {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"--config: no such file {str(p)!r}")
        tree = yaml.safe_load(p.read_text()) or {}
        _check(isinstance(tree, dict), str(p), "a config file must be a mapping of sections")
    for item in overrides or []:
        _check("=" in item, item, "overrides are key=value, e.g. train.steps=20")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
    cfg = _build(Config, tree, "")
    cfg._given = frozenset(_dotted_keys(tree))
    return cfg


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, dict):
            out += _dotted_keys(v, key + ".")
    return out


def dump_config(cfg: Config, only_changed: bool = True) -> str:
    """`cfg` as YAML that load_config reads back to an equal Config; only_changed: only the
    keys that differ from the defaults (what `digenrl plan` writes)."""
    tree = cfg.to_dict()
    if only_changed:
        tree = _diff(tree, Config().to_dict())
    return yaml.safe_dump(tree, sort_keys=False)


def _diff(tree: dict, default: dict) -> dict:
    out = {}
    for k, v in tree.items():
        d = default.get(k)
        if isinstance(v, dict) and isinstance(d, dict) and k not in ("weights", "paths", "resources"):
            sub = _diff(v, d)
            if sub:
                out[k] = sub
        elif v != d:
            out[k] = v
    return out

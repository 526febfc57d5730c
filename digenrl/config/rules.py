"""The checks across sections: each rule takes the whole Config and refuses one combination,
naming the key it acts on. `Config.__post_init__` (schema.py) calls them in order, after every
section checked its own keys. What a family can do is asked of digenrl.models.families."""

from __future__ import annotations

from digenrl.config.errors import check
from digenrl.config.runtime import SPOT_KEYS, PoolConfig, RuntimeConfig
from digenrl.math.kinds import CLEAN_SAMPLE_LOSSES
from digenrl.models.families import FAMILIES, conditioning_kind, grid_family, has, names, names_with
from digenrl.sched import BATCH_MODES, TAG_MODES


def _whole_step(cfg) -> bool:
    """Batch-level modes (and local) train nothing before the whole step is rewarded."""
    return cfg.run.mode == "local" or cfg.run.mode in BATCH_MODES


# -- weights, rewards and data ------------------------------------------------------------
def weights_given(cfg) -> None:
    """Real compute loads the policy and every model reward: each needs its weights named."""
    from digenrl.rewards import BUILTIN_REWARDS

    if cfg.runtime.compute != "real":  # emulated compute loads no model and no reward
        return
    m = cfg.model
    check(m.name == "tiny-dit" or bool(m.path), "model.path",
          f"{m.name} needs its weights: a local diffusers pipeline folder or a hub id in the HF cache")
    for name in cfg.reward.weights:
        check(name in BUILTIN_REWARDS or name in cfg.reward.paths, f"reward.paths.{name}",
              f"reward {name!r} loads a model: set reward.paths.{name}=<local model folder>"
              + (" (remote: <url>#<served reward name>)" if name == "remote" else "")
              + (" (vlm-judge: url=http://host:port&model=<served model>)" if name == "vlm-judge" else ""))


def adv_std_streams(cfg) -> None:
    check(_whole_step(cfg) or cfg.reward.adv_std != "global", "reward.adv_std",
          f"'global' needs every reward of the step before any training, which run.mode={cfg.run.mode} "
          "streams past; use group or none, or mode local/" + "/".join(BATCH_MODES))


def rollout_dtype(cfg) -> None:
    check(not cfg.sampling.rollout_dtype or cfg.model.dtype == "float32", "sampling.rollout_dtype",
          f"runs the rollout below the trainer's float32; with model.dtype={cfg.model.dtype} both already "
          "compute at that precision: leave it empty")


def lora_only_sync(cfg) -> None:
    check(cfg.runtime.weight_sync != "lora-only" or cfg.model.lora_rank > 0, "runtime.weight_sync",
          "lora-only sends adapters only: set model.lora_rank > 0")


def dpo_whole_groups(cfg) -> None:
    """train.loss=dpo draws its pairs within a prompt group, so every Train unit must hold
    whole groups: the settings that cut one are refused, named."""
    if cfg.train.loss != "dpo":
        return
    check(not cfg.data.micro_batch_samples, "data.micro_batch_samples",
          "cuts prompt groups, and train.loss=dpo pairs samples within a group in one Train unit: "
          "use data.micro_batch_groups")
    check(cfg.runtime.train_shard == 1, "runtime.train_shard",
          "cuts a micro-batch's prompt groups across Train units, and train.loss=dpo pairs samples "
          "within a group in one unit: leave it at 1")
    check(cfg.data.group_size >= 2, "data.group_size", "train.loss=dpo pairs samples of a prompt group: set >= 2")


def gdpo_whole_groups(cfg) -> None:
    check(not (cfg.data.micro_batch_samples and cfg.reward.aggregate == "gdpo"), "reward.aggregate",
          "gdpo standardises each reward within its prompt group on the micro-batch that holds it, and "
          "data.micro_batch_samples cuts groups; use sum, or whole groups (data.micro_batch_groups)")


def micro_batch_samples_streams(cfg) -> None:
    check(_whole_step(cfg) or not cfg.data.micro_batch_samples, "data.micro_batch_samples",
          f"cuts prompt groups, which run.mode={cfg.run.mode} streams to training before the group's "
          "advantages exist; use data.micro_batch_groups, or mode local/" + "/".join(BATCH_MODES))


# -- run.mode and the Ray pools -----------------------------------------------------------
def ray_only(cfg) -> None:
    """run.mode=local runs one process without Ray: the one place that refuses the runtime
    keys only a Ray run reads (each named, with what it would do)."""
    if cfg.run.mode != "local":
        return
    rt = cfg.runtime
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
        check(not is_set, key, f"{what}; run.mode=local runs one process without Ray: pick a Ray mode")


def sharded_trainer(cfg) -> None:
    """What a sharded (shard=fsdp) trainer gang cannot do."""
    rt, model = cfg.runtime, cfg.model
    if rt.trainer.shard != "fsdp":
        return
    check(not model.device.startswith("cuda") or rt.trainer.num_gpus >= 1, "runtime.trainer.num_gpus",
          "each rank of a sharded gang needs a GPU of its own (NCCL refuses two ranks on one GPU); set >= 1")
    check(model.dtype != "float16", "model.dtype",
          "sharded trainers compute in bfloat16 or float32 (fp32 master weights); float16 would need "
          "loss scaling, which is not built")
    check(cfg.train.loss != "dpo" or model.lora_rank > 0, "train.loss",
          "dpo needs its reference, and one for a sharded full fine-tune (a second sharded copy of "
          "the base model) is not built: use LoRA (the reference is the adapters switched off)")
    check(cfg.train.beta == 0 or model.lora_rank > 0, "train.beta",
          "a KL reference for a sharded full fine-tune (a second sharded copy of the base model) is not "
          "built; use LoRA (the reference is the adapters switched off) or beta 0")
    # each rank routes its own rows to an expert by sigma, so ranks would all-gather different
    # experts' shards and the collectives would not pair up
    check(not has(model.name, "two_experts"), "runtime.trainer.shard",
          f"fsdp is not built for two-expert families ({model.name}); use shard=none")


def sequence_parallel(cfg) -> None:
    rt = cfg.runtime
    if rt.rollout.gang > 1 or rt.trainer.sp > 1:
        key = "runtime.rollout.gang" if rt.rollout.gang > 1 else "runtime.trainer.sp"
        check(has(cfg.model.name, "sequence_parallel"), key,
              "sequence parallelism splits video tokens: model.name must be one of "
              f"{', '.join(names(sequence_parallel=True))}, got {cfg.model.name}")


def rollout_workers(cfg) -> None:
    mode = cfg.run.mode
    if mode != "local":
        check(cfg.runtime.rollout.workers >= 1 or mode == "colocated" or mode in TAG_MODES,
              "runtime.rollout.workers",
              f"run.mode={mode} needs at least one rollout worker (only colocated and the TAG "
              "modes generate on trainers)")


def tag_offload(cfg) -> None:
    mode = cfg.run.mode
    check(cfg.runtime.trainer.tag_offload == "auto" or mode == "colocated" or mode in TAG_MODES,
          "runtime.trainer.tag_offload",
          f"acts when a trainer generates, and under run.mode={mode} no trainer does (only colocated and the "
          f"TAG modes {', '.join(TAG_MODES)}): leave it at auto")


def colocated_spot(cfg) -> None:
    if cfg.run.mode == "colocated":
        for name in SPOT_KEYS:
            check(getattr(cfg.runtime.rollout, name) == getattr(PoolConfig, name), f"runtime.rollout.{name}",
                  "run.mode=colocated has no rollout pool: every worker trains, and a trainer's state "
                  "cannot be reclaimed")


def cuda_pools(cfg) -> None:
    """model.device=cuda on Ray: every pool that loads the policy must reserve a GPU. A Ray
    actor with num_gpus 0 sees no GPU (CUDA_VISIBLE_DEVICES is empty) and would fail on its
    first CUDA call, after Ray and the other workers started. Emulated compute loads no model;
    colocated runs every policy worker with the trainer pool's options."""
    rt, mode, device = cfg.runtime, cfg.run.mode, cfg.model.device
    if device.startswith("cuda") and mode != "local" and rt.compute != "emulated":
        for name in ["trainer"] if mode == "colocated" else ["rollout", "trainer"]:
            pool = getattr(rt, name)
            check(pool.workers == 0 or pool.num_gpus > 0, f"runtime.{name}.num_gpus",
                  f"is 0, but model.device={device} with run.mode={mode} loads the "
                  f"policy on every {name} worker: set runtime.{name}.num_gpus=1 (or model.device=cpu)")


def nft_sharded_reshard(cfg) -> None:
    # DiffusionNFT's old policy swaps its shadows into the sharded parameters; reshard=after-step
    # keeps the gathered (live) copies between forwards, which would then not see the swap
    trainer = cfg.runtime.trainer
    check(not (cfg.train.nft_decay > 0 and trainer.shard == "fsdp" and trainer.reshard == "after-step"),
          "train.nft_decay", "swaps the old policy into the sharded parameters, which "
          "runtime.trainer.reshard=after-step keeps gathered between forwards: use reshard=after-forward")


# -- the model family, the sampler and the loss -------------------------------------------
def sigma_grid(cfg) -> None:
    name = cfg.model.name
    check(cfg.sampling.sigmas == "digenrl" or name != "tiny-dit", "sampling.sigmas",
          "diffusers builds a diffusers pipeline's grid; tiny-dit has no pipeline: use digenrl")
    check(cfg.sampling.sigmas == "digenrl" or name == "tiny-dit" or has(name, "grid"),
          "sampling.sigmas", f"the diffusers grid is not built for {name} (only for "
          f"{', '.join(names(grid=True))}): use digenrl")


def cfg_scale_low(cfg) -> None:
    name = cfg.model.name
    check(cfg.sampling.cfg_scale_low == 0 or has(name, "two_experts"), "sampling.cfg_scale_low",
          f"{name} has one transformer (only {', '.join(names(two_experts=True))} have a low-noise expert): "
          "leave it at 0 (sampling.cfg_scale guides every step)")


# Diffusers grids that start just below sigma 1, where flow-sde's std sqrt(s / (1 - s)) explodes.
# Wan2.1's UniPC flow sigmas start at 1 - 1e-6: std ~1000 x noise_level (flow_grpo's Wan sampler
# uses another noise schedule there, zhtmike/flow_grpo@9745241 (a fork of yifan123/flow_grpo)
# flow_grpo/diffusers_patch/wan_pipeline_with_logprob.py:44-52, which no sampling.sde
# kind implements); SANA's DPM-Solver flow sigmas at 0.9997 (flow_shift 3, 10 steps): std ~58 x
# noise_level; Cosmos-Predict2.5's UniPC Karras flow sigmas at 200/201 = 0.995: std ~14 x noise_level.
# Which families: `grid_near_one` in digenrl.models.families (a conditioned family's is its base's).


def flow_sde_near_one(cfg) -> None:
    s, name = cfg.sampling, cfg.model.name
    near_one = name in FAMILIES and grid_family(name).grid_near_one
    check(not (s.sigmas == "diffusers" and near_one and s.sde == "flow-sde"),
          "sampling.sigmas",
          f"diffusers on {name} starts just below sigma 1 (wan: 1 - 1e-6, sana: 0.9997, "
          "cosmos-predict2.5: 0.995), where flow-sde's noise explodes (std ~ 1000 / ~58 / ~14 x noise_level); "
          "use sigmas=digenrl with flow-sde, or another sampling.sde")


def ode_clean_losses(cfg) -> None:
    # an ODE rollout records no log-probs: only the losses on clean samples train on it
    check(cfg.sampling.sde != "ode" or cfg.train.loss in CLEAN_SAMPLE_LOSSES, "sampling.sde",
          f"ode records no log-probs for train.loss={cfg.train.loss} to train on: use an SDE kind "
          "(flow-sde, dance-sde, cps), or train.loss=nft, dpo or awm (they train on the clean samples)")


def gaussian_step_losses(cfg) -> None:
    # RatioNorm undoes the Gaussian log-ratio's drift -|d mean|^2 / (2 std^2); cps scores
    # the surrogate -|x' - mean|^2, which has no std to normalise by
    loss, sde = cfg.train.loss, cfg.sampling.sde
    check(loss not in ("grpo-guard", "flow-dppo") or sde in ("flow-sde", "dance-sde"),
          "train.loss", f"{loss} measures a Gaussian step (RatioNorm, Flow-DPPO's divergence); "
          f"sampling.sde={sde} scores a surrogate: use sampling.sde=flow-sde or dance-sde, or train.loss=grpo")


def window_draw(cfg) -> None:
    # a per-sample draw among the SDE steps needs every step but the last to be SDE
    s = cfg.sampling
    check(s.window_draw == "step" or cfg.train.loss in CLEAN_SAMPLE_LOSSES or s.window in ("all-but-last", "fraction"),
          "sampling.window_draw",
          f"sample draws each sample's trained steps among all SDE steps; sampling.window={s.window} "
          "samples only its window with the SDE: use window fraction or all-but-last, or window_draw=step")


def conditioned_rows(cfg) -> None:
    """A conditioned family reads a conditioning image per prompt: both prompt lists are
    .jsonl rows (whether their rows carry images, and whether an unconditioned family's rows
    do not, is read from the files by digenrl/tools/preflight.py and the trainer)."""
    from digenrl.data import ROWS_SUFFIX

    name = cfg.model.name
    kind = conditioning_kind(name)
    if kind is not None:
        rows = f'a {ROWS_SUFFIX} file of {{"prompt": ..., "image": ...}} rows'
        check(cfg.data.prompts.endswith(ROWS_SUFFIX), "data.prompts",
              f"{name} is conditioned on a {kind} per prompt: give {rows}")
        check(cfg.data.held_out_prompts().endswith(ROWS_SUFFIX), "data.eval_prompts",
              f"{name} is conditioned on a {kind} per prompt: give {rows} "
              f"(the held-out rows; 'auto' has no images)")


def reward_inputs(cfg) -> None:
    """A reward that compares with the source needs a conditioned family; one that scores
    audio (AUDIO_REWARDS) or videos (VIDEO_REWARDS) a family that generates them."""
    from digenrl.rewards import AUDIO_REWARDS, SOURCE_REWARDS, VIDEO_REWARDS

    name = cfg.model.name
    conditioned = names_with("conditioning")
    for reward in cfg.reward.weights:
        check(reward not in SOURCE_REWARDS or has(name, "conditioning"), f"reward.weights.{reward}",
              f"compares each sample with its source image; {name} has none "
              f"(conditioned families: {', '.join(conditioned)})")
    for reward in cfg.reward.weights:
        check(reward not in AUDIO_REWARDS or has(name, "audio"), f"reward.weights.{reward}",
              f"scores the generated audio; {name} generates none "
              f"(families with audio: {', '.join(names(audio=True))})")
        check(reward not in VIDEO_REWARDS or has(name, "video"), f"reward.weights.{reward}",
              f"scores videos; {name} generates images (video families: {', '.join(names(video=True))})")


def toy_geneval_prompts(cfg) -> None:
    if cfg.model.name == "tiny-dit":
        for name in cfg.reward.weights:
            check(name != "toy-geneval" or cfg.data.prompts == "toy", "reward.weights.toy-geneval",
                  "judges toy-world prompts only: set data.prompts=toy")

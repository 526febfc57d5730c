"""The peers as they ship: which costs veRL-Omni, mm_grpo, GenRL and flow_grpo pay per RL step.

A `System` lists the mechanisms a peer's own code runs, each cited to the file and line that
runs it (`System.sources`; docs/design/simulator.md prints them). The simulator runs every system in
the scheduler's colocated mode (all GPUs generate, score, then train) and prices each
mechanism with the one global cost model (CostModel, collectives, the gang byte counts):

    Generate       sampling forwards: CFG as one call over 2B rows (cfg_calls=1) or two calls
                   over B (2); sampling with the FSDP-wrapped module pays an all-gather per call
                   (what the forward cannot hide); text encoding per prompt, or per sample when
                   every sample is its own request (encode_per_sample)
    Reward         VAE decode (one sample at a time when decode_serial) + the reward model
    Train          policy forward+backward per trained step (CFG calls as above), a no-grad
                   reference forward per call when the testbed has kl, recomputed old log-probs
                   in micro-batches of logp_batch, FSDP gathers and reduce-scatters over the
                   system's shard group (sim.gangs: the same bytes as DigenRL's gangs)
    OptimizerStep  `optimizer_steps` AdamW steps, and the per-step moves (step_costs below)

Nothing here is fitted to a published number: every constant is a property of the system's
code (a flag, a batch size, a dtype) or of the hardware (catalogue, devices).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from digenrl.sim.catalogue import (BYTES_WEIGHT, TEXT_DIMS, TEXT_ENCODERS, VAES, get_model, latent_values,
                                   get_judge, get_reward, trainable_params_B)
from digenrl.sim.costs import JudgeServing
from digenrl.sim.collectives import allgather_traffic, driver_dispatch_s, pageable_s, pcie_s

VO = "verl-project/verl-omni@a1139baf"
VO_FT = "verl-project/verl-omni@c415a591"  # the commit that published the full fine-tune figure
VO_LORA = "verl-project/verl-omni@1cf9aa94"  # ... and the LoRA figures
VO_JUNE = "verl-project/verl-omni@d07f42ba"  # ... and the 64x H100 FSDP1 figure
VO_NFT = "verl-project/verl-omni@0d5610f5"  # ... and the DiffusionNFT figure
VL = "verl-project/verl@8a694930"  # verl-omni's verl pin
MM = "leibniz-csi/mm_grpo@301f5c05"
GR = "ModelTC/GenRL@82a867e"
FG = "yifan123/flow_grpo@879042c"


@dataclass(frozen=True)
class Dispatch:
    """A single controller's batch traffic per RL step (the verl lineage): whole-batch transfers
    through one driver process (collectives.driver_dispatch_s), each sample carrying its image,
    the stored latents of its trained steps, and its prompt embeddings."""

    out: int  # whole-batch dispatches driver -> workers per RL step
    into: int  # whole-batch returns workers -> driver per RL step
    image_bytes: int  # bytes per image value in the batch (4: fp32)
    latent_bytes: int  # bytes per stored latent value
    negative: str  # negative prompt embeddings shipped: "cfg" (with CFG only) | "always"
    reward_out: bool = False  # + one out when the reward runs as a phase (the batch goes to the reward worker)
    ref_out: bool = False  # + one out when KL is on (a separate reference pass)

    def sample_bytes(self, tb) -> float:
        m = get_model(tb.model)
        frames = tb.frames
        latent = latent_values(m, tb.shape)
        tokens = tb.shape.text_tokens if tb.shape.text_tokens is not None else (
            m.text_tokens or TEXT_ENCODERS[m.text_encoder][1])
        embeds = tokens * TEXT_DIMS[m.text_encoder] * BYTES_WEIGHT
        negative = self.negative == "always" or tb.cfg
        return (3 * tb.height * tb.width * frames * self.image_bytes + (tb.trained_steps + 1) * latent
                * self.latent_bytes + embeds * (2 if negative else 1))

    def dispatches(self, tb, reward: str) -> tuple[int, int]:
        """(out, in) whole-batch transfers per RL step on `tb` with the system's reward placement."""
        return self.out + (self.reward_out and reward == "phase") + (self.ref_out and tb.kl), self.into


@dataclass(frozen=True)
class System:
    """One peer's mechanisms (see the module doc). `sources`: mechanism -> citation."""

    name: str
    label: str
    sampler: str  # copy-sleep (separate rollout copy, offloaded and reloaded every step) | copy (resident
    #               separate copy) | shared (the trained module, unwrapped) | fsdp (the FSDP-wrapped module)
    shard: str  # world (FSDP FULL_SHARD over every GPU) | replicated (every GPU holds the whole model) |
    #             zero2 (DeepSpeed ZeRO-2: weights replicated, gradients and optimizer state sharded)
    cfg_calls: int  # sampling CFG: 1 = cond and uncond in one call over 2B rows, 2 = two calls over B
    train_cfg_calls: int  # the same in training (policy, reference and recomputed forwards)
    encode_per_sample: bool  # every sample a request of its own: the text encoder runs per sample
    recompute_logp: bool  # old log-probs recomputed by the trainer (one no-grad pass per trained step)
    logp_batch: int | None  # micro-batch of the recomputed old log-probs (None: the train micro-batch)
    reduce_every_backward: bool  # no no_sync: a gradient reduction after every (micro-batch, step) backward
    param_moves: int  # param shard host<->device round trips per RL step (offload); 0: resident
    optimizer_moves: int  # optimizer state (+ grads) round trips per RL step
    gather_bytes: int  # bytes/param of the gather that feeds a full fine-tune's rollout copy (0: none)
    reward: str  # phase (reward model woken, run, put to sleep each step) | overlap (runs inside sampling)
    #              | pool (a reward GPU of its own scores each sample as it finishes: only the decode stays)
    reward_moves: bool  # the reward model is moved to the GPU and back every step
    decode_serial: bool  # VAE decode one sample at a time
    optimizer_steps: int  # mini-batches (optimizer steps) per RL step in the shipped recipes
    pageable_offload: bool = False  # offload copies to unpinned host memory (collectives.pageable_s)
    dispatch: Dispatch | None = None  # a single controller's batch traffic (None: SPMD, no driver)
    sources: dict = field(default_factory=dict, compare=False)


SYSTEMS: dict[str, System] = {s.name: s for s in [
    System(
        "verl-omni", "veRL-Omni", sampler="copy-sleep", shard="world", cfg_calls=2, train_cfg_calls=2,
        encode_per_sample=True, recompute_logp=True, logp_batch=32, reduce_every_backward=True,
        param_moves=3, optimizer_moves=1, gather_bytes=4, reward="phase", reward_moves=False,
        decode_serial=False, optimizer_steps=2, pageable_offload=True,
        dispatch=Dispatch(out=2, into=1, image_bytes=1, latent_bytes=4, negative="cfg", reward_out=True),
        sources={
            "rollout copy sleeps (level 1: DiT, text encoder, VAE to host) every step":
                f"{VO}:verl_omni/trainer/diffusion/ray_diffusion_trainer.py:1167; "
                f"{VO}:verl_omni/workers/rollout/vllm_rollout/vllm_omni_async_server.py:398-411",
            "... and wakes (weights back to the GPU) before every weight push":
                f"{VO}:verl_omni/workers/engine_workers.py:1036-1040",
            "CFG as two transformer calls (rollout, training, old log-probs)":
                f"{VO}:verl_omni/pipelines/qwen_image_flow_grpo/vllm_omni_rollout_adapter.py:443-467; "
                f"{VO}:verl_omni/pipelines/qwen_image_flow_grpo/diffusers_training_adapter.py:222-227",
            "one request per sample (text encoder per request, negative prompt too)":
                f"{VO}:verl_omni/pipelines/qwen_image_flow_grpo/vllm_omni_rollout_adapter.py:256-268",
            "FSDP1 FULL_SHARD over the whole world (fsdp_size -1)":
                f"{VO}:verl_omni/trainer/config/diffusion/engine/diffusion_fsdp.yaml:26; "
                f"{VL}:verl/workers/engine/fsdp/utils.py:52-53,84-86",
            "fp32 gradient reduction after every (micro-batch, timestep) backward, no no_sync":
                f"{VO}:verl_omni/workers/engine/fsdp/diffusers_impl.py:316-321,800,804-815",
            "old log-probs recomputed (bypass_mode false), log-prob micro-batch 32":
                f"{VO}:verl_omni/trainer/config/diffusion_trainer.yaml:102; "
                f"{VO}:verl_omni/trainer/diffusion/ray_diffusion_trainer.py:1195-1204; "
                f"{VO_FT}:examples/flowgrpo_trainer/run_qwen_image_ocr.sh:40",
            "param + optimizer offload in every shipped recipe: params 3 round trips (old log-probs, "
            "update, weight sync), optimizer state + grads 1":
                f"{VO_FT}:examples/flowgrpo_trainer/run_qwen_image_ocr.sh:35-37; "
                f"{VL}:verl/workers/engine/base.py:244-266; "
                f"{VO}:verl_omni/workers/engine/fsdp/diffusers_impl.py:734-761",
            "weights for the rollout gathered with full_tensor() in fp32, then cast to bf16":
                f"{VO}:verl_omni/workers/engine/fsdp/diffusers_impl.py:768-777",
            "reward model as a phase of its own: woken, scores every image, put to sleep":
                f"{VO}:verl_omni/trainer/diffusion/ray_diffusion_trainer.py:1180-1188; "
                f"{VL}:verl/experimental/reward_loop/reward_loop.py:343-355",
            "two optimizer steps per RL step (ppo_mini_batch_size 16 of 32 prompts)":
                f"{VO}:docs/algo/flowgrpo.md:188-202",
            "each mini-batch's micro-batches are passes of their own (gathers, reduce-scatters each)":
                f"{VO}:verl_omni/workers/engine_workers.py:325-349",
            "old log-probs in infer micro-batches through the FSDP-wrapped module (a gather per forward)":
                f"{VO}:verl_omni/workers/engine_workers.py:455-475",
            "offload copies to unpinned host memory":
                f"{VL}:verl/utils/fsdp_utils.py:169-249",
            "the whole batch through the driver: generation back (uint8 images, fp32 window latents, "
            "prompt and negative embeds), then out to the reward worker, old log-probs and the update":
                f"{VO}:verl_omni/trainer/diffusion/ray_diffusion_trainer.py:1177-1188; "
                f"{VO}:verl_omni/workers/rollout/vllm_rollout/vllm_omni_async_server.py:80-88; "
                f"{VO_LORA}:verl_omni/experimental/agent_loop/diffusion_agent_loop.py:214-222; "
                f"{VL}:verl/protocol.py:388-420",
        }),
    System(
        "mm_grpo", "mm_grpo", sampler="copy", shard="replicated", cfg_calls=1, train_cfg_calls=1,
        encode_per_sample=False, recompute_logp=True, logp_batch=None, reduce_every_backward=True,
        param_moves=0, optimizer_moves=0, gather_bytes=4, reward="overlap", reward_moves=False,
        decode_serial=False, optimizer_steps=2,
        dispatch=Dispatch(out=2, into=1, image_bytes=4, latent_bytes=2, negative="always", ref_out=True),
        sources={
            "a separate diffusers pipeline kept on the GPU (free_cache_engine false)":
                f"{MM}:gerl/workers/rollout/diffusers_rollout/diffusers_rollout.py:66-89; "
                f"{MM}:examples/flowgrpo_trainer/run_sd3.sh:32",
            "fsdp_size 1: every GPU holds the whole model":
                f"{MM}:examples/flowgrpo_trainer/run_sd3.sh:24; {MM}:gerl/workers/diffusers_fsdp_workers.py:127-128",
            "CFG as one call over 2B rows (pipeline and training)":
                f"{MM}:gerl/workers/actor/diffusers_actor.py:100-115",
            "old log-probs recomputed by default (bypass_mode false)":
                f"{MM}:gerl/trainer/config/algorithm/rollout_correction.yaml:2; "
                f"{MM}:gerl/trainer/ppo/ray_diffusion_trainer.py:981-993",
            "reference forward in the actor with LoRA disabled when KL is on":
                f"{MM}:gerl/trainer/ppo/ray_diffusion_trainer.py:163-167,999-1012",
            "one backward per (micro-batch, timestep), no no_sync":
                f"{MM}:gerl/workers/actor/diffusers_actor.py:257-314",
            "OCR reward on the CPU in Ray tasks, overlapping generation":
                f"{MM}:gerl/utils/reward_score/ocr.py:41; "
                f"{MM}:gerl/workers/rollout/diffusers_rollout/diffusers_rollout.py:191-199",
            "two optimizer steps per RL step (ppo_mini_batch_size 32 of 64 prompts)":
                f"{MM}:gerl/workers/diffusers_fsdp_workers.py:223-224",
            "the whole batch through the driver (fp32 images, fp16 latents of every cached step, prompt "
            "and negative embeds): generation back, out to old log-probs, the reference pass and the update":
                f"{MM}:gerl/workers/diffusers_fsdp_workers.py:736,782,820,823,846-851,868-879; "
                f"{MM}:gerl/workers/rollout/diffusers_rollout/diffusers_rollout.py:125-132,164-190",
        }),
    System(
        "genrl", "GenRL", sampler="fsdp", shard="world", cfg_calls=2, train_cfg_calls=2,
        encode_per_sample=False, recompute_logp=False, logp_batch=None, reduce_every_backward=False,
        param_moves=0, optimizer_moves=0, gather_bytes=0, reward="overlap", reward_moves=True,
        decode_serial=True, optimizer_steps=2,
        sources={
            "FSDP1 FULL_SHARD over the whole world, no HSDP":
                f"{GR}:config/default.yaml:82-98; {GR}:genrl/utils.py:54-73",
            "samples with the FSDP-wrapped module":
                f"{GR}:genrl/trainer/wan_trainer.py:333-334",
            "CFG as two transformer calls in sampling and in training":
                f"{GR}:genrl/diffusers_patch/wan_pipeline_with_logprob.py:308-325; "
                f"{GR}:genrl/trainer/diffusion.py:45-60",
            "KL beta 3e-4 in the shipped configs: a reference forward per trained step":
                f"{GR}:config/default.yaml:53; {GR}:genrl/trainer/wan_trainer.py:566-586",
            "keeps the sampler's log-probs":
                f"{GR}:genrl/trainer/sampling.py:135,162",
            "gradient accumulation through accelerate (no_sync between boundaries)":
                f"{GR}:genrl/trainer/wan_trainer.py:590; {GR}:genrl/trainer/base_trainer.py:369-374",
            "reward models moved to the GPU and back every step, then empty_cache":
                f"{GR}:genrl/rewards.py:88-129",
            "VAE decode one sample at a time":
                f"{GR}:genrl/diffusers_patch/wan_pipeline_with_logprob.py:522-527",
            "two optimizer steps per RL step (2 batches per epoch, accumulation 1)":
                f"{GR}:config/default.yaml:32,49",
        }),
    System(
        "flow_grpo", "flow_grpo", sampler="shared", shard="zero2", cfg_calls=1, train_cfg_calls=1,
        encode_per_sample=False, recompute_logp=False, logp_batch=None, reduce_every_backward=False,
        param_moves=0, optimizer_moves=0, gather_bytes=0, reward="overlap", reward_moves=False,
        decode_serial=False, optimizer_steps=2,
        sources={
            "accelerate DDP (SD3.5; FLUX: DeepSpeed ZeRO-2, no offload), one process per GPU":
                f"{FG}:scripts/accelerate_configs/multi_node.yaml:2,9; "
                f"{FG}:scripts/accelerate_configs/deepspeed_zero2.yaml:6-9",
            "samples with the trained LoRA module itself, outside the DDP wrapper":
                f"{FG}:scripts/train_sd3.py:442,643",
            "CFG as one call over 2B rows (sampling and train.cfg)":
                f"{FG}:flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py:103-105,144-159; "
                f"{FG}:scripts/train_sd3.py:857-864",
            "reference forward (adapter disabled) per trained step when beta > 0":
                f"{FG}:scripts/train_sd3.py:880-883",
            "keeps the sampler's log-probs":
                f"{FG}:scripts/train_sd3.py:661,684,891",
            "rewards in an 8-thread pool overlapping the next sampling batch":
                f"{FG}:scripts/train_sd3.py:563,668-701",
            "gradient all-reduce at accumulation boundaries only":
                f"{FG}:scripts/train_sd3.py:877",
            "two optimizer steps per epoch in every recipe":
                f"{FG}:config/grpo.py:98,102; {FG}:README.md:449",
        }),
]}


# veRL-Omni as it was when it published its Qwen-Image figures (1cf9aa94, c415a591): the same
# mechanisms, but the rollout returned fp32 images (uint8 since), so every dispatch moved 4x the pixels.
_SPRING = dataclasses.replace(
    SYSTEMS["verl-omni"], name="verl-omni@2026-05", label="veRL-Omni (May 2026)",
    dispatch=dataclasses.replace(SYSTEMS["verl-omni"].dispatch, image_bytes=4),
    sources={"images returned as fp32 (PILToTensor().float() / 255)":
             f"{VO_LORA}:verl_omni/workers/rollout/vllm_rollout/vllm_omni_async_server.py:188; "
             f"{VO_FT}:verl_omni/workers/rollout/vllm_rollout/vllm_omni_async_server.py:205"})
_ASYNC_REWARD = dataclasses.replace(
    _SPRING, name="verl-omni@2026-05-async-reward", label="veRL-Omni (May 2026), async reward GPU", reward="pool",
    sources={"reward on a GPU pool of its own, each sample scored as it finishes (no wake/sleep)":
             f"{VO}:verl_omni/agent_loop/diffusion_agent_loop.py:305-333; "
             f"{VO}:examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora_async_reward.sh:14-17,60-66"})
# ... and when it published its 64x H100 FSDP1 figure (d07f42ba): the same code (fp32 images still),
# run with the parameters resident (param_offload False), the optimizer state offloaded.
_JUNE = dataclasses.replace(
    _SPRING, name="verl-omni@2026-06", label="veRL-Omni (June 2026), parameters resident", param_moves=0,
    sources={"parameters resident, optimizer state offloaded in the 64x H100 run":
             f"{VO_JUNE}:docs/algo/performance.md:87; "
             f"{VO_JUNE}:verl_omni/workers/rollout/vllm_rollout/vllm_omni_async_server.py:264"})
# ... and its DiffusionNFT trainer when it published that figure (0d5610f5; fp32 images still): no old
# log-probs (DiffusionNFT trains from the final latents against its "old" adapter, whose forward runs
# inside the update: the testbed's old_forward), a reference pass (ref_kl_coef: the testbed's kl).
_NFT = dataclasses.replace(
    _SPRING, name="verl-omni@2026-06-nft", label="veRL-Omni (June 2026), DiffusionNFT", recompute_logp=False,
    sources={"DiffusionNFT's step: generation, the reward phase, a reference pass, the update (the old "
             "adapter's forward inside it); no old log-probs":
             f"{VO}:verl_omni/trainer/diffusion/ray_diffusion_trainer.py:1620,1638-1645,1657-1661,1663-1666; "
             f"{VO_NFT}:verl_omni/workers/rollout/vllm_rollout/vllm_omni_async_server.py:257",
             "LoRA 64 with the old adapter, no CFG, mini-batch 12 of 24 prompts, param + optimizer offload, "
             "the judge tensor-parallel over the 4 GPUs":
             f"{VO}:examples/diffusionnft_trainer/qwen_image/run_qwen_image_ocr_lora.sh:16,27,32-46,54-57,73"})
# A generative judge as the reward phase serves it: eager mode is the reward rollout's default.
_JUDGE_SOURCES = {
    "the OCR judge asked for up to 4096 tokens per answer, served by vLLM in eager mode (the reward "
    "rollout's enforce_eager default), max_num_seqs 1024: a step's answers decode together":
        f"{VO}:verl_omni/utils/reward_score/genrm_ocr.py:38; "
        f"{VO}:verl_omni/trainer/config/_generated_diffusion_trainer.yaml:407,416; "
        f"{VO_JUNE}:verl_omni/trainer/config/_generated_diffusion_trainer.yaml:378"}
SYSTEMS["verl-omni"].sources.update(_JUDGE_SOURCES)
SYSTEMS.update({_SPRING.name: _SPRING, _ASYNC_REWARD.name: _ASYNC_REWARD, _JUNE.name: _JUNE, _NFT.name: _NFT})


def get_system(name: str) -> System:
    try:
        return SYSTEMS[name]
    except KeyError:
        raise KeyError(f"unknown shipped system {name!r}; allowed: {sorted(SYSTEMS)}") from None


def shard_group(system: System, n_gpus: int) -> int:
    """GPUs one FSDP shard group spans (1: weights replicated, DDP or ZeRO-2)."""
    return n_gpus if system.shard == "world" else 1


def layout_of(system: System):
    """The colocated memory plan (baselines.Layout) a system's code runs: how it shards, what
    samples, what it parks on the host while training, whether its AdamW state leaves the GPU."""
    from digenrl.sim.baselines import Layout

    shard = {"world": "fsdp", "zero2": "zero2", "replicated": "replicated"}[system.shard]
    sampler = {"copy-sleep": "copy", "copy": "copy", "shared": "shared", "fsdp": "fsdp"}[system.sampler]
    parked = ("rollout", "text_encoder", "vae", "reward") if system.sampler == "copy-sleep" else ()
    if system.reward_moves or system.reward == "pool":  # the reward model is not on the GPU while it trains
        parked = tuple(dict.fromkeys(parked + ("reward",)))
    return Layout(shard, "world", sampler, parked, offload=system.optimizer_moves > 0,
                  no_sync=shard == "fsdp" and not system.reduce_every_backward)


def fit(cm, system: System, tb, device: str, n_gpus: int):
    """Does the system as shipped fit on one GPU? The one memory rule of colocated rows
    (baselines.layout_fit) on the system's own layout (layout_of). Returns (fits, peak GiB, usable GiB)."""
    from digenrl.sim.baselines import layout_fit

    gpn = tb.pools[0].gpus_per_node
    rep = layout_fit(cm, layout_of(system), tb.model, device, n_gpus, gpn, gen_batch=tb.rollout_batch,
                     train_batch=tb.micro_batch, lora=tb.lora, lora_rank=tb.lora_rank, grad_ckpt=tb.grad_ckpt,
                     cfg=tb.cfg, train_cfg=tb.train_cfg, shape=tb.shape, kl=tb.kl, reward=tb.reward)
    return rep.fits, rep.peak_gib, rep.usable_gib


def step_costs(cm, system: System, tb, device: str, n_gpus: int, link: str) -> dict[str, float]:
    """Once-per-RL-step seconds on every GPU, by name (charged on the OptimizerStep).

    rollout_sleep_wake  copy-sleep: the rollout copy's DiT, text encoder and VAE (bf16) to the
                        host and back over PCIe
    weight_gather       a full fine-tune's rollout copy refilled: all-gather of every parameter
                        at gather_bytes over the shard group (fp32 full_tensor, then the cast)
    param_offload       param_moves round trips of this GPU's parameter shard (fp32 masters for a
                        full fine-tune, the bf16 base under LoRA) over PCIe (unpinned: pageable_s)
    optimizer_offload   optimizer_moves round trips of this GPU's AdamW state + gradients (12 B/param)
    reward_moves        the reward model to the GPU and back (reward_moves, or a reward phase's
                        wake and sleep)
    judge_decode        a generative judge's decode (costs.judge_decode_s): a reward phase waits for
                        the longest answer of the step; a reward pool for the last images' answers
    extra_optimizer     AdamW steps beyond the scheduler's one per RL step
    driver_dispatch     a single controller's whole-batch transfers (Dispatch), every GPU waiting
    """
    m = get_model(tb.model)
    shards = shard_group(system, n_gpus)
    trainable = trainable_params_B(tb.model, tb.lora, tb.lora_rank)
    out: dict[str, float] = {}
    if system.sampler == "copy-sleep":
        te_B = TEXT_ENCODERS[m.text_encoder][0]
        vae_B = VAES[m.vae][0]
        nbytes = BYTES_WEIGHT * (m.params_B + te_B + vae_B) * 1e9
        out["rollout_sleep_wake"] = 2 * float(pcie_s(nbytes, device))
    if system.sampler in ("copy", "copy-sleep") and system.gather_bytes and not tb.lora and shards > 1:
        out["weight_gather"] = allgather_traffic(system.gather_bytes * m.params_B * 1e9, shards,
                                                 chunks=m.layers).seconds(link)
    copy = pageable_s if system.pageable_offload else pcie_s
    if system.param_moves:
        per_param = 4 if not tb.lora else BYTES_WEIGHT
        out["param_offload"] = system.param_moves * 2 * float(copy(per_param * m.params_B * 1e9 / shards, device))
    if system.optimizer_moves:
        out["optimizer_offload"] = system.optimizer_moves * 2 * float(copy(12 * trainable * 1e9 / shards, device))
    if system.dispatch is not None:
        batch = system.dispatch.sample_bytes(tb) * tb.samples_per_step
        n_out, n_in = system.dispatch.dispatches(tb, system.reward)
        out["driver_dispatch"] = (n_out * driver_dispatch_s(batch, n_gpus, True)
                                  + n_in * driver_dispatch_s(batch, n_gpus, False))
    judge = get_judge(tb.reward)
    if system.reward_moves or system.reward == "phase":
        params_B = get_reward(tb.reward)[0]
        # a woken reward server is tensor-parallel over the GPUs (a judge: over the recipe's judge_tp)
        tp = (tb.judge_tp if judge else n_gpus) if system.reward == "phase" else 1
        out["reward_moves"] = 2 * float(pcie_s(BYTES_WEIGHT * params_B * 1e9 / tp, device))
    if judge is not None and system.reward in ("phase", "pool"):
        # phase: every answer of the step decodes together on n_gpus / judge_tp servers and the phase
        # ends with the longest; pool: scoring overlaps generation but for the last image of each GPU
        n = tb.samples_per_step if system.reward == "phase" else n_gpus
        out["judge_decode"] = float(cm.judge_decode_s(tb.reward, device, n, JudgeServing.of(tb)))
    if system.optimizer_steps > 1:
        out["extra_optimizer"] = (system.optimizer_steps - 1) * float(cm.optimizer_step_s(trainable / shards, device))
    return {k: v for k, v in out.items() if v > 0}


def citations_markdown() -> str:
    """docs/design/simulator.md's table of every shipped mechanism and the code that runs it."""
    rows = ["| system | mechanism | where its code does it |", "|---|---|---|"]
    for s in SYSTEMS.values():  # variants list only what differs from the system they derive from
        for what, where in s.sources.items():
            rows.append(f"| {s.name} | {what} | {'; '.join(f'`{w.strip()}`' for w in where.split(';'))} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(citations_markdown())

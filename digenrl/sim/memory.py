"""Memory model: GiB each role holds on one GPU, and whether a set of roles fits.

    catalogue (bytes per parameter, model sizes)  +  calibration table (activation fits)
        --memory_gib--> Memory(weights, grads, optimizer, activations) per role
        --fits-------->  FitReport: train-phase and other-phase peaks vs usable HBM

It answers "what can a worker hold at once", never "how long": the planners (durations'
FSDP choice, baselines.colocated_plan, testbed checks) ask it through CostModel.memory_gib
and CostModel.fits, which pass the fitted table in. Its own module because its rules
(ZeRO byte accounting, phases that free their activations, usable fraction of HBM) are
independent of the time model.

Memory in GiB (2**30 B), like torch and the calibration file's `peak_GB`.
"""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.sim.catalogue import (BYTES_GRAD, BYTES_LORA, BYTES_OPT, BYTES_WEIGHT, DEFAULT_LORA_RANK, GIB,
                                   TEXT_ENCODERS, VAE_CALIB_SHAPES, VAES, Shape, get_model, get_reward,
                                   lora_params_B, tokens_for)
from digenrl.sim.devices import REFERENCE, get_device


@dataclass(frozen=True)
class Memory:
    """GiB one role holds on one GPU. `activations` is transient (one phase at a time)."""

    weights: float = 0.0
    grads: float = 0.0
    optimizer: float = 0.0
    activations: float = 0.0
    estimated: bool = False
    load: float = 0.0  # transient GiB above `weights` while the role loads its model (load_gib)

    @property
    def resident(self) -> float:
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.resident + self.activations


@dataclass(frozen=True)
class FitReport:
    """Does a set of roles fit on one GPU at once?

    A worker runs one phase at a time. Weights and optimizer state stay resident; gradients
    live only in the train phase (freed by zero_grad(set_to_none=True) after the optimizer
    step, before the next generation); activations belong to their role's phase. So
        train_peak = weights + optimizer + grads + trainer activations
        other_peak = weights + optimizer + largest other activations  (generate, decode, reward)
    and with offload_optimizer the optimizer state is on the host outside the train phase.
    Before either, the roles load their models (AdamW state and gradients do not exist yet):
        load_peak = weights + the largest transient of one role's load (Memory.load)
    """

    device: str
    roles: dict[str, Memory]
    train_peak_gib: float
    other_peak_gib: float
    usable_gib: float
    estimated: bool
    load_peak_gib: float = 0.0

    @property
    def peak_gib(self) -> float:
        return max(self.train_peak_gib, self.other_peak_gib, self.load_peak_gib)

    @property
    def fits(self) -> bool:
        return self.peak_gib <= self.usable_gib


ROLES = ("rollout", "rollout_shared", "trainer", "ref", "text_encoder", "vae", "reward")
# bf16 blocks a trainer gang rank holds gathered under reshard after-forward (FSDP2): the block
# in use, and the next one's all-gather output beside the parameters it is copied out into
# (FSDP2 copies a unit's flat all-gather buffer out to per-parameter tensors, then frees it).
# Measured: torch.profiler's allocator events over a LoRA step of a 1B FLUX-width model on 2
# gloo ranks peak at 2.05 GiB above the step's start: three 0.63 GiB double-stream blocks +
# 0.15 GiB of activations (docs/measurements/runtime.md, "Sharded loading"). FSDP1's flat parameters gather
# in place: the colocated layouts keep two.
GANG_GATHERED_BLOCKS = 3
# Usable memory: 95% of the device (allocator fragmentation) minus 1 GiB (CUDA context, NCCL buffers).
USABLE_FRACTION, RESERVED_GIB = 0.95, 1.0


def _activations(table: dict, model: str, op: str, batch: float, shape: Shape | None,
                 sp: int = 1) -> tuple[float, bool]:
    """Fitted activation GiB of `op` at `batch`, scaled to `shape` (estimated when it is not the
    calibration shape); a sequence-parallel rank (sp > 1) holds 1/sp of every sample's tokens."""
    fit = table[model, op]
    m = get_model(model)
    tok_est = shape is not None and shape != m.calib_shape
    k = tokens_for(m, shape) / tokens_for(m) if tok_est else 1.0  # flash attention: linear in tokens
    return fit.fixed + fit.per_sample * k * batch / sp, fit.estimated or tok_est or sp > 1


def load_gib(params: float, layers: int, gang: int = 1, *, adapters: float = 0.0,
             loader: str = "sharded") -> tuple[float, float]:
    """(held, transient) GiB of one trainer gang rank at its load peak, for `params` base
    parameters in `layers` blocks and `adapters` LoRA parameters (0: a full fine-tune). The
    rank ends the load holding fp32 masters of what trains and, under LoRA, the frozen base in
    bf16, all / gang (runtime/gang_rank.py):
        held = (4 * trained + 2 * frozen) / gang
    loader="sharded" (runtime/sharded_load.py): each rank reads its rows of one tensor at a time,
    files reopened per FSDP unit; the transient is bounded by one block in fp32:
        transient = 4 * params / layers
    loader="whole" (the path it replaced, still GangRank's for families that cannot build on
    meta): the whole model built in fp32 on every rank while from_pretrained reads the bf16
    checkpoint a file at a time (one block's worth here), then sharded unit by unit (FSDP2 copies
    a block's shard out, then frees the block: the first copy lives beside the whole model;
    under LoRA the base is cast to bf16 before):
        peak = 4 * (params + adapters) + max(2 * params / layers, cast / layers / gang)
    The process's own constant (CUDA context; on a CPU the interpreter and torch) is not in it:
    fits() reserves RESERVED_GIB for it, the CPU benchmark (benchmarks/load_memory.py) reports it.
    """
    if loader not in ("sharded", "whole"):
        raise ValueError(f"loader must be 'sharded' or 'whole', got {loader!r}")
    n = max(1, gang)
    trained, frozen = (adapters, params) if adapters else (params, 0.0)
    cast = 4 * trained + BYTES_WEIGHT * frozen  # what a rank holds of the model, all / gang
    held = cast / n / GIB
    if loader == "sharded":
        return held, 4 * params / max(1, layers) / GIB
    layers = max(1, layers)
    whole = 4 * (params + adapters) + max(BYTES_WEIGHT * params / layers, cast / layers / n)
    return held, whole / GIB - held


def gang_gathered_gib(params: float, layers: int, gang: int) -> float:
    """GiB of bf16 parameters a trainer gang rank holds gathered under reshard after-forward:
    GANG_GATHERED_BLOCKS blocks of params / layers (none at a gang of 1, which gathers nothing)."""
    return GANG_GATHERED_BLOCKS * BYTES_WEIGHT * params / layers / GIB if gang > 1 else 0.0


def gang_rank_memory(params: float, layers: int, gang: int, *, adapters: float = 0.0, after_step: bool = False,
                     offload: bool = False, activations: float = 0.0, estimated: bool = False) -> Memory:
    """What one rank of a trainer gang holds (memory_gib's gang rule, see there) for `params`
    base parameters in `layers` blocks and `adapters` LoRA parameters (0: a full fine-tune):
    a shape the catalogue does not list (benchmarks/load_memory.py) is priced by the same rule."""
    n = max(1, gang)
    gathered = gang_gathered_gib(params, layers, n)
    held = BYTES_WEIGHT * params / GIB if after_step else gathered
    t = adapters or params  # trainable parameters
    base = BYTES_WEIGHT * params / n / GIB if adapters else 0.0  # frozen base, bf16, sharded
    _, load = load_gib(params, layers, n, adapters=adapters)
    return Memory(4 * t / n / GIB + base + held, 4 * t / n / GIB, 0.0 if offload else 8 * t / n / GIB, activations,
                  estimated, load=load)


def memory_gib(table: dict, model: str, role: str, *, batch: int = 1, lora: bool = False, grad_ckpt: bool = True,
               fsdp_shards: int = 1, cfg: bool = False, shape: Shape | None = None,
               lora_rank: int = DEFAULT_LORA_RANK, reward: str = "pickscore", after_step: bool = False,
               offload: bool = False, gang: bool = False, sp: int = 1) -> Memory:
    """GiB a role holds on one GPU (see ROLES), from the calibration `table` (calibration.fit_table).

    rollout         own bf16 copy (sharded / fsdp_shards + two gathered layers) + forward activations
    rollout_shared  forward activations only: it samples with the trainer's module (flow_grpo)
    trainer         16 B/param full (ZeRO accounting) / fsdp_shards, or bf16 base + fp32 LoRA
                    state; + fwd+bwd activations of a micro-batch
                    gang=True (a trainer gang, runtime.trainer.shard=fsdp, gangs.md): fp32 master
                    weights 4 + fp32 gradients 4 + AdamW m, v 8 B/param, all / fsdp_shards (LoRA:
                    of the adapters; the frozen base in bf16 / shards, runtime/gang_rank.py);
                    gathered bf16 parameters: GANG_GATHERED_BLOCKS blocks (reshard
                    after-forward: in use, the next one's all-gather output and its copy-out)
                    or the whole model (after_step: kept for the step); offload: the AdamW state on the host; load: the sharded
                    loader's transient (load_gib). The rank holds nothing else: reward models,
                    text encoders and evaluation live on the rollout workers, the reward pool
                    and the evaluation actor (runtime/workers.py TrainerRank), each their role
                    here; a colocated or TAG trainer that scores adds the reward role. (The
                    runtime's trainer rank keeps the small VAE beside the policy: not charged.)
    sp              sequence-parallel degree (runtime.rollout.gang for a rollout rank,
                    runtime.trainer.sp for a trainer rank): activations / sp; a rollout gang
                    rank still holds the whole bf16 model (no FSDP in a rollout gang)
    ref             bf16 reference copy for the KL term (0 with LoRA: adapters disabled)
    text_encoder, vae (+ decode activations), reward
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    m = get_model(model)
    n = max(1, fsdp_shards)
    p = m.params_B * 1e9
    gathered = 2 * BYTES_WEIGHT * p / m.layers / GIB if n > 1 else 0.0  # FSDP: layer in use + prefetched
    b = batch * (2 if cfg else 1)
    if role in ("rollout", "rollout_shared"):
        act, est = _activations(table, model, "act_forward", b, shape, sp)
        w = 0.0 if role == "rollout_shared" else BYTES_WEIGHT * p / n / GIB + gathered
        return Memory(weights=w, activations=act, estimated=est)
    if role == "trainer" and gang:
        act, est = _activations(table, model, "act_train_ckpt" if grad_ckpt else "act_train", b, shape, sp)
        adapters = lora_params_B(model, lora_rank) * 1e9 if lora else 0.0
        return gang_rank_memory(p, m.layers, n, adapters=adapters, after_step=after_step, offload=offload,
                                activations=act, estimated=est)
    if role == "trainer":
        act, est = _activations(table, model, "act_train_ckpt" if grad_ckpt else "act_train", b, shape, sp)
        if lora:
            pl = lora_params_B(model, lora_rank) * 1e9
            bw, bg, bo = BYTES_LORA
            return Memory(BYTES_WEIGHT * p / n / GIB + gathered + bw * pl / GIB, bg * pl / GIB,
                          bo * pl / GIB, act, est)
        return Memory(BYTES_WEIGHT * p / n / GIB + gathered, BYTES_GRAD * p / n / GIB, BYTES_OPT * p / n / GIB,
                      act, est)
    if role == "ref":
        return Memory(0.0 if lora else BYTES_WEIGHT * p / n / GIB + gathered)
    if role == "text_encoder":
        return Memory(BYTES_WEIGHT * TEXT_ENCODERS[m.text_encoder][0] * 1e9 / GIB)
    if role == "vae":
        params_B, calib, factor = VAES[m.vae]
        mem = table[calib, "decode_mem"]
        k = (shape or m.calib_shape).pixels / VAE_CALIB_SHAPES[calib].pixels
        # Decode peaks include the VAE weights; activations scale with pixels (tiling would cap this).
        return Memory(BYTES_WEIGHT * params_B * 1e9 / GIB, activations=mem(batch) * k, estimated=True)
    params_B, _, _ = get_reward(reward)
    return Memory(BYTES_WEIGHT * params_B * 1e9 / GIB, activations=0.5 + 0.05 * batch, estimated=True)  # guess


def fits(table: dict, model: str, roles, device=REFERENCE, *, gen_batch: int = 1, train_batch: int = 1,
         shards: dict | None = None, offload_optimizer: bool = False, **kw) -> FitReport:
    """Can one GPU hold `roles` (see ROLES, FitReport) at once? Usable memory is
    USABLE_FRACTION * HBM - RESERVED_GIB. kw go to memory_gib (lora, grad_ckpt,
    fsdp_shards, cfg, shape, lora_rank, reward, after_step, offload, gang, sp); `shards`
    overrides fsdp_shards per role."""
    mems = {}
    for role in roles:
        kw_role = dict(kw, fsdp_shards=(shards or {}).get(role, kw.get("fsdp_shards", 1)))
        mems[role] = memory_gib(table, model, role, batch=train_batch if role == "trainer" else gen_batch, **kw_role)
    return fits_memories(device, mems, offload_optimizer=offload_optimizer)


def fits_memories(device, mems: dict, train_roles: dict | None = None, offload_optimizer: bool = False) -> FitReport:
    """The one fit rule over what each role holds (FitReport): `train_roles` are the roles resident
    in the train phase (default: all of them; a colocated layout parks some on the host)."""
    dev = get_device(device)
    train = mems if train_roles is None else train_roles
    weights = sum(mm.weights for mm in mems.values())
    opt = sum(mm.optimizer for mm in mems.values())
    # gradients live in the train phase only (FitReport)
    train_peak = (sum(mm.weights + mm.optimizer + mm.grads for mm in train.values()) + mems["trainer"].activations
                  if "trainer" in mems else 0.0)
    other_act = max((mm.activations for r, mm in mems.items() if r != "trainer"), default=None)
    other_peak = 0.0 if other_act is None else weights + (0.0 if offload_optimizer else opt) + other_act
    est = any(mm.estimated for mm in mems.values()) or dev.name != REFERENCE
    load_peak = weights + max((mm.load for mm in mems.values()), default=0.0)  # (FitReport)
    return FitReport(dev.name, mems, train_peak, other_peak, USABLE_FRACTION * dev.hbm_gib - RESERVED_GIB, est,
                     load_peak)

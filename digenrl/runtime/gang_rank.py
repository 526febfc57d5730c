"""One rank of a sharded trainer gang: what changes inside a trainer actor when shard=fsdp.

    world = every trainer rank, as a (gangs, gang) DeviceMesh ("replicate", "shard")

      gang 0:  rank 0  rank 1  ...      FSDP2 over a row: the policy's parameters, gradients
      gang 1:  rank N  rank N+1 ...     and AdamW state are sharded over the gang's devices
                 |       |
              all-reduce down each column, once per RL step (HSDP): the local gradient
              shards of the gangs, at the optimizer step (the scheduler spreads Train units
              over gangs, which run them independently, so FSDP's own per-backward HSDP
              reduction, which needs the gangs in lockstep, is not used)

A Train unit's rows are shared out over the gang's ranks (`share`): each rank backwards its
rows weighted by their share of the whole RL step, FSDP reduce-scatters the sum. Ranks with
fewer rows run zero-weight ghost passes so every rank issues the same collectives.

Sequence parallelism (runtime.trainer.sp = P): the gang's consecutive ranks form groups of
P that run the same rows, each on 1/P of the video tokens (digenrl.models.sequence_parallel);
rows are shared out over the groups. Each rank's gradient is then its part of its group's,
and the same FSDP sum over the gang adds the parts up.

Loading (runtime/sharded_load.py): a trainer rank builds its policy on the meta device
(`trainer_policy`), shards it, and reads only its own rows of each weight from the checkpoint,
so no rank ever holds the whole model. A family that cannot be built empty (wan2.2's two
experts) is built whole on every rank and rank 0's state is broadcast before sharding. Either
way the module starts identical on every rank and holds fp32 master weights of what it
trains: model.dtype is the compute dtype (FSDP MixedPrecisionPolicy), the dtype weights are
published in, and under LoRA the dtype the frozen base is held in.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from digenrl.config.schema import Config, with_overrides
from digenrl.learner import Learner
from digenrl.learner.comm import CommCounter, count_fsdp, fsdp_units
from digenrl.learner.passes import pass_count
from digenrl.math.grad_sum import GradSum, local
from digenrl.learner.sharded import shard_policy
from digenrl.models.empty import is_empty
from digenrl.math.payload import row_share
from digenrl.runtime.sharded_load import materialise
from digenrl.runtime.weight_sync import payload_state

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def master_config(cfg: Config) -> Config:
    """The config a trainer rank builds its model from: fp32 master weights under FSDP (under
    LoRA GangRank then returns the frozen base to the compute dtype; on the meta device, before
    a byte of it exists)."""
    if cfg.runtime.trainer.shard == "fsdp" and cfg.model.dtype != "float32":
        return with_overrides(cfg, {"model.dtype": "float32"})
    return cfg


def trainer_policy(cfg: Config):
    """The policy a trainer rank builds (cfg: master_config's): under shard=fsdp, on the meta
    device when the model allows (GangRank materialises each rank's shards), else whole."""
    from digenrl.models import build_policy, empty_loadable

    empty = cfg.runtime.trainer.shard == "fsdp" and empty_loadable(cfg.model)
    return build_policy(cfg.model, progress=False, empty=empty)


def load_sharded(policy, mesh, *, dtype: str, lora: bool, reshard_after_forward: bool = True,
                 offload: bool = False, device: str = "cpu") -> None:
    """Shard `policy` (built by trainer_policy in fp32, on meta or whole) over `mesh` (a gang's
    ranks; every rank calls it): the frozen base back to `dtype` under LoRA, FSDP2 with bf16
    compute unless dtype is float32, then this rank's shards read from the checkpoint
    (sharded_load.materialise) or, for a module built whole, rank 0's state broadcast first."""
    module = policy.module
    empty = is_empty(module)
    if not empty:
        with torch.no_grad():  # identical starting weights on every rank (LoRA's init included)
            for value in module.state_dict().values():
                dist.broadcast(value, src=0)
    if lora and dtype != "float32":
        # fp32 master copies are for what the optimizer steps: the frozen base stays in
        # the compute dtype (half the bytes; FSDP gathers everything in that dtype anyway)
        with torch.no_grad():
            for param in module.parameters():
                if not param.requires_grad:
                    param.data = param.data.to(_DTYPES[dtype])
    shard_policy(policy, mesh, reshard_after_forward=reshard_after_forward, mixed_precision=dtype != "float32",
                 offload=offload)
    if empty:
        # offload: the shards live on the host (FSDP2 CPUOffloadPolicy), the buffers on the device
        materialise(module, policy.weight_files, "cpu" if offload else device)
        if offload and device != "cpu":
            module.apply(lambda m: m._buffers.update({k: b.to(device) for k, b in m._buffers.items()
                                                      if b is not None}))


class GangRank:
    """Shards `trainer`'s policy over its gang and owns the rank's collectives (see module doc)."""

    def __init__(self, cfg: Config, trainer, world_rank: int, gangs: int, gang: int, counter: CommCounter):
        pool = cfg.runtime.trainer
        self.gangs, self.size = gangs, gang
        self.rank = world_rank % gang
        device = "cuda" if cfg.model.device.startswith("cuda") else "cpu"
        self.mesh = init_device_mesh(device, (gangs, gang), mesh_dim_names=("replicate", "shard"))
        module = trainer.policy.module
        self.sp = pool.sp
        self.sp_rank = self.rank % self.sp
        if self.sp > 1:  # before FSDP wraps the module; every rank makes every group (a collective)
            group, _ = dist.new_subgroups(group_size=self.sp)
            trainer.policy.enable_sequence_parallel(group, counter)
        self.after_step_reshard = pool.reshard == "after-step"
        load_sharded(trainer.policy, self.mesh["shard"], dtype=cfg.model.dtype, lora=cfg.model.lora_rank > 0,
                     reshard_after_forward=not self.after_step_reshard, offload=pool.offload, device=device)
        self.units = fsdp_units(module)
        if self.after_step_reshard:  # keep the gathered parameters until the optimizer step
            for unit in self.units:
                unit.set_reshard_after_backward(False)
        self.counter = counter
        count_fsdp(module, counter)
        trainer.learner = Learner(trainer.policy, trainer.learner.config)  # on the sharded parameters
        self.module = module
        self.backward_batch = trainer.learner.config.backward_batch
        self.pairs_per_pass = trainer.learner.config.pairs_per_pass
        # the cross-gang gradient reduction's group (all_reduce_grads); none with one gang
        self.replicas: Optional[dist.ProcessGroup] = self.mesh.get_group("replicate") if gangs > 1 else None
        self.group: dist.ProcessGroup = self.mesh.get_group("shard")  # this gang's ranks (checkpoints)

    def share(self, n: int, slots: int) -> tuple[slice, int]:
        """This rank's rows of a unit of n rows and `slots` trained slots (its sequence-parallel
        group's), and the passes every rank runs for the unit: those of the largest share
        (learner.passes.pass_count), the others padded with ghost passes."""
        groups = self.size // self.sp
        most = -(-n // groups)
        passes = pass_count(most, slots, self.backward_batch, self.pairs_per_pass)
        return row_share(n, groups, self.rank // self.sp), passes

    def after_step(self) -> None:
        """reshard=after-step: the optimizer changed the shards, drop the stale gathered copies."""
        if self.after_step_reshard:
            for unit in self.units:
                unit.reshard()

    def gather_payload(self, engine: str, dtype: str, into: Optional[dict] = None) -> dict[str, torch.Tensor]:
        """Every rank: the weights the rollout workers load (weight_sync.payload_state),
        gathered in `dtype` (a collective). Only rank 0 copies them to the host (the payload it
        publishes), into `into`'s tensors by name when given (the relay's pinned buckets:
        weight_sync=nccl); the others return {} and drop each gathered tensor at once."""
        state = payload_state(engine, self.module)
        cast = _DTYPES[dtype]
        out = {}
        with self.counter.phase("publish"):
            for name, value in state.items():
                value = value.detach()
                if value.is_floating_point():
                    value = value.to(cast)
                if isinstance(value, DTensor):
                    shard = value.to_local()
                    rows = -(-value.shape[0] // self.size) if value.dim() else 1
                    per_row = math.prod(value.shape[1:]) if value.dim() > 1 else 1
                    if self.size > 1:
                        self.counter.add_bytes("all_gather", self.size * rows * per_row * shard.element_size())
                    value = value.full_tensor()
                if self.rank == 0 and into is not None:
                    into[name].copy_(value)
                elif self.rank == 0:
                    out[name] = value.to("cpu", copy=True).contiguous()
        return out


def all_reduce_grads(grads: GradSum, group: Optional[dist.ProcessGroup], counter: CommCounter) -> None:
    """Sum the trainers' accumulated gradients over `group` (None: every trainer; a gang's
    rank: its column of the mesh, the same shard on every gang), once per RL step, in the
    dtype the learner sums them in (`train.grad_sum`: float64 keeps the sum independent of
    which trainer ran which unit, see digenrl.math.grad_sum).

    A float32 mask says who touched each parameter: one all-reduced in which nobody did
    keeps grad None everywhere, as on a single device; a rank that did not gets the sum.
    Sharded parameters reduce their local shards (every gang shards alike).
    """
    if dist.get_world_size(group) <= 1:
        return
    params = grads.params
    device = local(params[0]).device
    has = torch.tensor(grads.touched(), dtype=torch.float32, device=device)
    counter.add("all_reduce", has)
    dist.all_reduce(has, group=group)
    locals_ = [local(p) for p in params]
    flat = torch.cat([(s if s is not None else torch.zeros_like(lp, dtype=grads.dtype)).reshape(-1).to(grads.dtype)
                      for s, lp in zip(grads.local_sums(), locals_)])
    counter.add("all_reduce", flat)
    dist.all_reduce(flat, group=group)
    offset = 0
    for i, (lp, h) in enumerate(zip(locals_, has.tolist())):
        n = lp.numel()
        if h > 0:
            grads.set_local_sum(i, flat[offset:offset + n].view_as(lp))
        offset += n

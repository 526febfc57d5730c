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

The module starts identical on every rank (rank 0's state is broadcast before sharding, so
LoRA's random initialisation agrees) and holds fp32 master weights of what it trains:
model.dtype is the compute dtype (FSDP MixedPrecisionPolicy), the dtype weights are
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
from digenrl.math.grad_sum import GradSum, local
from digenrl.learner.sharded import shard_policy
from digenrl.runtime.gang import row_share
from digenrl.runtime.weight_sync import payload_state

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def master_config(cfg: Config) -> Config:
    """The config a trainer rank builds its model from: fp32 master weights under FSDP."""
    if cfg.runtime.trainer.shard == "fsdp" and cfg.model.dtype != "float32":
        return with_overrides(cfg, {"model.dtype": "float32"})
    return cfg


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
        with torch.no_grad():  # identical starting weights on every rank (LoRA's init included)
            for value in module.state_dict().values():
                dist.broadcast(value, src=0)
        if cfg.model.lora_rank > 0 and cfg.model.dtype != "float32":
            # fp32 master copies are for what the optimizer steps: the frozen base stays in
            # the compute dtype (half the bytes; FSDP gathers everything in that dtype anyway)
            with torch.no_grad():
                for param in module.parameters():
                    if not param.requires_grad:
                        param.data = param.data.to(_DTYPES[cfg.model.dtype])
        self.after_step_reshard = pool.reshard == "after-step"
        shard_policy(trainer.policy, self.mesh["shard"], reshard_after_forward=not self.after_step_reshard,
                     mixed_precision=cfg.model.dtype != "float32", offload=pool.offload)
        self.units = fsdp_units(module)
        if self.after_step_reshard:  # keep the gathered parameters until the optimizer step
            for unit in self.units:
                unit.set_reshard_after_backward(False)
        self.counter = counter
        count_fsdp(module, counter)
        trainer.learner = Learner(trainer.policy, trainer.learner.config)  # on the sharded parameters
        self.module = module
        self.backward_batch = trainer.learner.config.backward_batch
        # the cross-gang gradient reduction's group (all_reduce_grads); none with one gang
        self.replicas: Optional[dist.ProcessGroup] = self.mesh.get_group("replicate") if gangs > 1 else None
        self.group: dist.ProcessGroup = self.mesh.get_group("shard")  # this gang's ranks (checkpoints)

    def share(self, n: int) -> tuple[slice, int]:
        """This rank's rows of a unit of n rows (its sequence-parallel group's), and the passes
        per trained step every rank runs."""
        groups = self.size // self.sp
        most = -(-n // groups)
        passes = -(-most // self.backward_batch) if self.backward_batch else 1
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

"""Sharded loading: each rank of a trainer gang materialises only its own rows of the model.

    build_policy(model, empty=True)      the module's structure, parameters on meta (models/empty.py)
       |  LoRA injected, dtypes set, sequence parallelism enabled (all on meta, no bytes)
    shard_policy(...)                    FSDP2 over the gang: every parameter becomes a DTensor
       |                                 whose local part is this rank's rows (still on meta)
    materialise(module, files, ...)      to_empty: allocate the local rows only; then, one FSDP unit
                                         at a time, read those rows from the checkpoint's safetensors
                                         (get_slice: the slice's bytes only) and cast them

Peak memory per rank while loading: the rank's shards (model / gang, in the dtypes the rank
holds) + the rows of one tensor being read and cast + the buffers (small, whole on every rank)
+ the mapped pages of one FSDP unit's rows (the files are reopened per unit). sim/memory.py's
`load_peak_gib` charges this as shards + one block. The whole-model path it replaces
(build everything in fp32, broadcast tensor by tensor, then shard) held the whole fp32 model
on every rank; it stays in GangRank for modules built whole (families that cannot load empty).

Values equal the whole-model path's: a parameter's rows are the checkpoint's rows cast to the
dtype the rank holds it in, the same cast the whole path applies before sharding; LoRA's
adapters are not in the checkpoint and are drawn as apply_lora draws them (lora_B zero,
lora_A from its seeded generator, models/lora.py): every rank draws every lora_A in the same
order and keeps its rows. Buffers keep the values the constructor computed, unless the
checkpoint holds them.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from digenrl.learner.sharded import transformer_blocks
from digenrl.models.empty import WeightFiles
from digenrl.models.lora import LoraSpec, lora_a_draws

# peft renames a wrapped layer's own weights (to_q.weight -> to_q.base_layer.weight)
_PEFT_BASE = ".base_layer"


def checkpoint_name(name: str) -> str:
    """A module state name -> the checkpoint's name for it (peft's base_layer dropped)."""
    return name.replace(_PEFT_BASE, "")


def local_index(value: torch.Tensor) -> tuple[slice, ...]:
    """The rows (one slice per dim) of the global tensor that `value`'s local part holds;
    the whole tensor for a plain tensor."""
    index = [slice(0, n) for n in value.shape]
    if not isinstance(value, DTensor):
        return tuple(index)
    mesh = value.device_mesh
    coordinate = [dist.get_rank(mesh.get_group(d)) for d in range(mesh.ndim)]  # this rank's place in the mesh
    for mesh_dim, placement in enumerate(value.placements):  # torch.chunk's split, as FSDP2 shards
        if isinstance(placement, Shard):
            rows = index[placement.dim]
            n = rows.stop - rows.start
            chunk = -(-n // mesh.size(mesh_dim))
            start = min(rows.start + coordinate[mesh_dim] * chunk, rows.stop)
            index[placement.dim] = slice(start, min(start + chunk, rows.stop))
        elif not isinstance(placement, Replicate):
            raise ValueError(f"cannot load a {placement} placement by slice")
    local = value.to_local().shape
    if tuple(s.stop - s.start for s in index) != tuple(local):
        raise ValueError(f"local rows {index} do not match the local shard's shape {tuple(local)}")
    return tuple(index)


def _units(module: torch.nn.Module) -> list[tuple[str, ...]]:
    """Names of the module's state grouped by FSDP unit (each block, then the root's rest)."""
    names = list(module.state_dict(keep_vars=True))
    prefixes = {id(b): None for b in transformer_blocks(module)}
    for prefix, sub in module.named_modules():
        if id(sub) in prefixes:
            prefixes[id(sub)] = prefix + "."
    groups: list[tuple[str, ...]] = []
    taken: set[str] = set()
    for prefix in prefixes.values():
        group = tuple(n for n in names if n.startswith(prefix))
        groups.append(group)
        taken.update(group)
    groups.append(tuple(n for n in names if n not in taken))
    return groups


@torch.no_grad()
def materialise(module: torch.nn.Module, files: WeightFiles, device: torch.device | str,
                lora_seed: Optional[int] = None) -> int:
    """Allocate and fill this rank's shards of `module` (FSDP2-sharded on the meta device, see the
    module doc) from `files`; LoRA adapters drawn with `lora_seed` (LoraSpec.init_seed by default).
    Returns the bytes this rank read from the checkpoint."""
    seed = LoraSpec.init_seed if lora_seed is None else lora_seed
    kept = {n: b.detach().clone() for n, b in module.named_buffers() if not b.is_meta}  # the constructor's
    module.to_empty(device=device)
    for name, buffer in module.named_buffers():  # (non-persistent ones are in no state dict)
        if name in kept:
            buffer.copy_(kept[name])
    state = module.state_dict(keep_vars=True)  # to_empty swapped the tensors
    shapes = {n: v.shape for n, v in state.items() if "lora_A" in n}
    lora_a = {n: value[local_index(state[n])] for n, value in lora_a_draws(shapes, seed)}  # (rows kept only)
    read = 0
    for group in _units(module):
        with files.open() as reader:
            for name in group:
                target = state[name]
                local = target.to_local() if isinstance(target, DTensor) else target
                source = checkpoint_name(name)
                if "lora_B" in name:
                    local.zero_()
                elif "lora_A" in name:
                    local.copy_(lora_a[name])
                elif source in files:
                    rows = reader.read(source, local_index(target))
                    read += rows.numel() * rows.element_size()
                    local.copy_(rows.to(local.dtype))
                elif name not in kept:
                    raise KeyError(f"{name}: not in the checkpoint ({files.files[0].parent}) and not made by the "
                                   f"module's constructor: nothing to load it from")
    return read

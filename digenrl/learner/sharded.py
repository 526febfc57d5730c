"""FSDP2 sharding of a policy's module over a gang of trainer processes.

The single-device `Learner` runs unchanged on the sharded module: every rank builds the
same policy, calls `shard_policy`, then builds its `Learner` (the optimizer must see the
sharded DTensor parameters, so after sharding) and trains its own disjoint rows of the
RL step:

    rank r:  accumulate(rows_r, total_samples=B_global)   # grad_r = d/dθ Σ_{rows_r} w_i l_i
             FSDP reduce-scatter, SUM over ranks          # Σ_r grad_r = single-device grad
             optimizer_step()                             # AdamW on this rank's shard

`Learner.accumulate` already weights each unit by its share of the *global* batch
(len(rows) / (total_samples * total_steps)), so the gradient of the whole step is the
sum of the ranks' gradients, not their mean. FSDP2 divides by the number of data-parallel
ranks by default (it assumes each rank's loss is a mean over its own rows); we set the
divide factor to 1 so the reduce-scatter is a plain sum and the sharded gradient equals
the single-device one. Gradient clipping (`clip_grad_norm_` on DTensor gradients) then
sees the norm of the whole gradient, and AdamW steps each shard elementwise.

Mesh: 1-D = FSDP over all ranks; 2-D ("replicate", "shard") = HSDP (shard inside a
node, all-reduce across replicas); the divide factor covers both dimensions.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from digenrl.models.lora import trainable_state_dict
from digenrl.models.protocol import Policy


def shard_policy(
    policy: Policy,
    mesh: DeviceMesh,
    *,
    reshard_after_forward: bool = True,
    mixed_precision: bool = False,
    offload: bool = False,
) -> Policy:
    """Shard `policy.module` in place with FSDP2: one unit per transformer block, one root.

    Blocks are found by `transformer_blocks` (the tiny DiT's and diffusers' block lists);
    a module without any is sharded as a single root unit. Inject LoRA first: a block's
    frozen base weights and trainable adapters then share one FSDP unit. Build the
    `Learner` after this call. mixed_precision: bf16 compute and all-gather, fp32
    gradient reduction (the sharded master weights keep their dtype). offload: sharded
    parameters, gradients and AdamW state live on the host (FSDP2 CPUOffloadPolicy; the
    optimizer steps there), for models whose optimizer state does not fit the devices.
    """
    if mesh.ndim not in (1, 2):
        raise ValueError(f"mesh must be 1-D (FSDP) or 2-D (replicate, shard) for HSDP, got {mesh.ndim}-D")
    module = policy.module
    kwargs: dict = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    units: list[FSDPModule] = [fully_shard(block, **kwargs) for block in transformer_blocks(module)]
    # the rest (embeddings, final layers) is the root unit; FSDP2 keeps the root
    # unsharded after forward anyway, since backward needs it first
    units.append(fully_shard(module, **kwargs))
    for unit in units:
        # Sum, not mean, over ranks: each rank's loss is already weighted by its share
        # of the global batch (see the module docstring). Forcing plain SUM collectives
        # keeps FSDP from expressing "divide by 1" as PREMUL_SUM(1.0), which gloo lacks.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return policy


BLOCK_LISTS = ("blocks", "transformer_blocks", "single_transformer_blocks")  # tiny DiT; diffusers DiTs
# Transformers that keep their blocks under other names, by class name (no diffusers import
# here). Their names stay out of BLOCK_LISTS: a generic `layers` there would also split any
# other family's unrelated ModuleList of that name. Z-Image (diffusers transformer_z_image.py):
# the latent and caption refiners, the Omni variant's SigLIP refiner (None otherwise), then
# the main layers, in forward order.
CLASS_BLOCK_LISTS = {
    "ZImageTransformer2DModel": ("noise_refiner", "context_refiner", "siglip_refiner", "layers"),
}


def block_lists(module: torch.nn.Module) -> tuple[str, ...]:
    """The attribute names of `module`'s block lists: its class's own, else `BLOCK_LISTS`."""
    return CLASS_BLOCK_LISTS.get(type(module).__name__, BLOCK_LISTS)


def transformer_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The FSDP units below the root: every block of the module's block lists (`block_lists`,
    an `nn.ModuleList` attribute each: the tiny DiT's `blocks`; SD3.5's `transformer_blocks`;
    FLUX.1's double- and single-stream lists; Z-Image's refiners and `layers`), in that order."""
    found = []
    for name in block_lists(module):
        blocks = getattr(module, name, None)
        if isinstance(blocks, torch.nn.ModuleList):
            found.extend(blocks)
    return found


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the unsharded trainable tensors, named as `trainable_state_dict` names them.

    A collective: every rank of the mesh must call it (each DTensor is all-gathered).
    """
    return full_tensors(trainable_state_dict(module))


def full_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole CPU copies of named tensors, DTensors gathered (e.g. an EMA's shadows).

    Always a copy (full_tensor() of a replicated or 1-wide DTensor can alias the live
    weights, which the next optimizer step changes in place). A collective when any
    tensor is a DTensor: every rank of its mesh must call it.
    """
    out = {}
    for name, value in tensors.items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        out[name] = value.detach().to("cpu", copy=True)
    return out

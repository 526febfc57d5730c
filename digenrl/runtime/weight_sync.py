"""Weight sync engines: how trainer 0's new weights reach the rollout workers.

    trainer 0: OptimizerStep(k) --publish(module)--> payload --(Ray object store)--> ref[k+1]
    rollout:   WeightSync(k+1) --load(module, payload)  (a pull, at a trajectory boundary)

The scheduler's pull model (see `digenrl.sched`) fixes the shape: the trainer side is part
of OptimizerStep, the receiving side is one WeightSync unit on one rollout worker, so a
trainer never waits for a rollout worker.

    object-store  the whole module state dict (base + adapters), as mm_grpo ships weights
    lora-only     the trainable tensors only: adapters under LoRA (needs model.lora_rank > 0)
    nccl          the same payload as lora-only under LoRA, else the whole state dict, handed to
                  trainer 0's relay (runtime/relay.py), which sends each version once down a
                  chain of the rollout workers (NCCL links on GPU, gloo on CPU); each loads it
                  at its pull

`publish` returns (payload, bytes); the driver records bytes and seconds per step.
"""

from __future__ import annotations

from typing import Dict

import torch

from digenrl.models.lora import has_lora, load_trainable_state_dict, trainable_state_dict


def payload_state(name: str, module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The live tensors engine `name` publishes: adapters for lora-only (and nccl under
    LoRA), else the whole state dict (sharded DTensors in a gang: runtime/gang_rank.py)."""
    if name == "lora-only" or (name == "nccl" and has_lora(module)):
        return trainable_state_dict(module)
    return module.state_dict()


def publish(name: str, module: torch.nn.Module) -> tuple[Dict[str, torch.Tensor], int]:
    """The payload trainer 0 puts in the object store, and its size in bytes."""
    payload = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in payload_state(name, module).items()}
    return payload, sum(v.numel() * v.element_size() for v in payload.values())


def load(name: str, module: torch.nn.Module, payload: Dict[str, torch.Tensor]) -> int:
    """Copy a published payload into `module` in place; returns the bytes received."""
    load_trainable_state_dict(module, payload)  # in place; raises on unknown names
    return sum(v.numel() * v.element_size() for v in payload.values())

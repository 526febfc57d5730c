"""Policies behind one protocol: the tiny DiT of the toy world, and diffusers adapters."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from digenrl.models.lora import LoraSpec, apply_lora
from digenrl.models.protocol import Cond, Policy, guided_velocity

if TYPE_CHECKING:
    from digenrl.config import ModelConfig

__all__ = ["Cond", "Policy", "build_policy", "guided_velocity"]


def build_policy(cfg: "ModelConfig", progress: bool = True) -> Policy:
    """Load the configured generator, with LoRA injected when lora_rank > 0 and activation
    checkpointing when grad_ckpt.

    `progress` is accepted for the callers' sake: nothing here is slow enough to show a
    bar (the toy base is a shipped file).
    """
    if cfg.name == "tiny-dit":
        from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiTPolicy
        from digenrl.models.tiny_dit_weights import load_base, load_tiny_dit

        module = load_tiny_dit(Path(cfg.path)) if cfg.path else load_base()
        module = module.to(getattr(torch, cfg.dtype))
        policy: Policy = TinyDiTPolicy(module, cfg.device)
        default_targets = LORA_TARGETS
    else:
        from digenrl.models.diffusers_adapters import default_lora_targets, load_policy

        if not cfg.path:
            raise ValueError(f"model.path: {cfg.name} needs a local folder (or cached hub id) of its weights")
        policy = load_policy(
            cfg.name,
            cfg.path,
            dtype=getattr(torch, cfg.dtype),
            device=cfg.device,
            height=cfg.height or None,
            width=cfg.width or None,
            frames=cfg.frames or None,
            prompt_cache=cfg.prompt_cache,
            text_encoders=cfg.text_encoders,
        )
        default_targets = default_lora_targets(cfg.name)
    if cfg.lora_rank > 0:
        policy.module.requires_grad_(False)
        apply_lora(policy.module, LoraSpec(cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets or default_targets)))
    if cfg.grad_ckpt:  # the tiny DiT and every diffusers transformer implement it
        policy.module.enable_gradient_checkpointing()
    return policy

"""Policies over diffusers transformers, one per family of `digenrl.models.families`.

    policy = load_policy("flux", "/models/FLUX.1-dev", height=512, width=512, train="lora")
    cond = policy.encode_prompts(["a cat"])             # Cond, batch-first
    v = policy.velocity(x, sigma, cond)                  # float32 (B, *policy.latent_shape)

Each family lives in its own file with the diffusers source lines its timestep, sign and
packing conventions come from. `base.py` holds what they share. What a family is and can do
(its class, conditioning, video, audio, experts, guidance, sigma grid) is declared once, in its
record; the classes take those traits from there.
"""

from __future__ import annotations

import importlib
from typing import Any

from digenrl.models.families import FAMILIES, family as _family

_REQUIRED = ("diffusers", "transformers", "peft", "safetensors")


def policy_class(family: str) -> type:
    """The adapter class of a family name (digenrl.models.families)."""
    spec = _family(family)
    for package in _REQUIRED:
        try:
            importlib.import_module(package)
        except ImportError as e:
            raise ImportError(
                f"the {family} adapter needs the package {package!r}: "
                f"pip install 'diffusers>=0.35' 'transformers>=4.45' 'peft>=0.13' safetensors"
            ) from e
    return getattr(importlib.import_module(spec.module), spec.cls)


# ModelConfig's names for two options (digenrl/config/model.py), accepted as aliases
_ALIASES = {"frames": "num_frames", "prompt_cache": "prompt_cache_dir"}


def load_policy(family: str, path_or_id: str, **opts: Any):
    """Load a diffusers pipeline folder (or a cached hub id) as a Policy.

    opts: the fields of AdapterOptions (height, width, num_frames, device, dtype, train,
    lora_rank, lora_alpha, lora_targets, gradient_checkpointing, guidance_scale,
    negative_prompt, max_sequence_length, prompt_cache_dir, model_id, cudnn_sdpa, experts), plus
    text_encoders (False: prompts come from the prompt cache only) and local_files_only.
    `frames` and `prompt_cache` are accepted for num_frames and prompt_cache_dir.
    """
    for alias, name in _ALIASES.items():
        if alias in opts:
            if name in opts:
                raise TypeError(f"pass {name} or its alias {alias}, not both")
            opts[name] = opts.pop(alias)
    return policy_class(family).from_pretrained(path_or_id, **opts)


def default_lora_targets(family: str) -> tuple[str, ...]:
    """The attention projections LoRA adapts by default (the same names for every family)."""
    return policy_class(family).default_lora_targets


def __getattr__(name: str) -> Any:  # lazy: importing the package does not import diffusers
    spec = next((f for f in FAMILIES.values() if f.cls == name), None)
    if spec is not None:
        return getattr(importlib.import_module(spec.module), name)
    if name in ("AdapterOptions", "DiffusersPolicy", "DEFAULT_LORA_TARGETS"):
        return getattr(importlib.import_module("digenrl.models.diffusers_adapters.base"), name)
    if name == "PromptCache":
        return importlib.import_module("digenrl.models.diffusers_adapters.prompt_cache").PromptCache
    raise AttributeError(name)


__all__ = [
    "FAMILIES", "default_lora_targets", "load_policy", "policy_class",
    *(f.cls for f in FAMILIES.values()),  # every family's policy class, loaded lazily (__getattr__)
    "AdapterOptions", "DiffusersPolicy", "PromptCache",
]

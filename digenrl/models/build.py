"""Building the configured policy (build_policy) and its sampling grid (sampling_sigmas)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

import torch

from digenrl.math.schedule import sigma_schedule
from digenrl.models.empty import WeightFiles, move
from digenrl.models.lora import LoraSpec, apply_lora
from digenrl.models.protocol import Cond, Policy, guided_velocity

__all__ = ["build_policy", "empty_loadable", "sampling_sigmas"]


def build_policy(cfg: Any, progress: bool = True, empty: bool = False) -> Policy:
    """Load the configured generator, with LoRA injected when lora_rank > 0 and activation
    checkpointing when grad_ckpt. `cfg` is a Config's `model` section (ModelConfig), read by
    attribute: models sit below the config layer and never import it.

    empty=True: the denoiser's parameters stay on the meta device (digenrl.models.empty) and
    `policy.weight_files` says where they are: a sharded trainer gang materialises each rank's
    own rows (runtime/sharded_load.py). Only for `empty_loadable(cfg)` models.

    `progress` is accepted for the callers' sake: nothing here is slow enough to show a
    bar (the toy base is a shipped file).
    """
    if empty and not empty_loadable(cfg):
        raise ValueError(f"model.name={cfg.name!r}: no empty (meta-device) build; see empty_loadable")
    weight_files = None
    if cfg.name == "tiny-dit":
        from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiTPolicy
        from digenrl.models.tiny_dit_weights import empty_tiny_dit, find_base, load_base, load_tiny_dit

        if empty:
            path = Path(cfg.path) if cfg.path else find_base()
            if path is None:
                load_base()  # raises, naming the missing base
            module = empty_tiny_dit(path)
            weight_files = WeightFiles([path])
        else:
            module = load_tiny_dit(Path(cfg.path)) if cfg.path else load_base()
        module = move(module, dtype=getattr(torch, cfg.dtype))
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
            max_sequence_length=cfg.max_sequence_length or None,  # 0: the family's default
            **({"guidance_scale": cfg.guidance} if cfg.guidance else {}),  # 0: the adapter's default
            **({"experts": cfg.experts} if cfg.experts else {}),  # wan2.2: "" = both
            **({"empty_weights": True} if empty else {}),
        )
        if empty:
            weight_files = policy.weight_files
        if cfg.guidance and not (policy.embedded_guidance and policy.module.config.get("guidance_embeds")):
            # ModelConfig refuses families without embedded guidance; this is a checkpoint of an
            # embedded-guidance family whose transformer has none (e.g. FLUX.1-schnell)
            raise ValueError(f"model.guidance: {cfg.path!r} embeds no guidance scale (its transformer has "
                             f"guidance_embeds false); leave model.guidance at 0")
        default_targets = default_lora_targets(cfg.name)
    if cfg.lora_rank > 0:
        policy.module.requires_grad_(False)
        # the adapters go where RL trains: the whole module, or one expert of wan2.2 (model.experts)
        trained = policy.trained_module() if hasattr(policy, "trained_module") else policy.module
        apply_lora(trained, LoraSpec(cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets or default_targets)))
    if cfg.grad_ckpt:  # the tiny DiT and every diffusers transformer implement it
        policy.module.enable_gradient_checkpointing()
    if empty:
        policy.weight_files = weight_files
    return policy


def empty_loadable(cfg: Any) -> bool:
    """Whether `build_policy(cfg, empty=True)` builds this model: the tiny DiT, and diffusers
    families with one transformer whose weights sit in transformer/*.safetensors (wan2.2's two
    experts, and folders in other formats, load whole)."""
    if cfg.name == "tiny-dit":
        return True
    from digenrl.models.families import has

    if has(cfg.name, "two_experts") or not cfg.path:
        return False
    return any((Path(cfg.path) / "transformer").glob("*.safetensors"))


@functools.lru_cache(maxsize=32)
def _diffusers_sigmas(family: str, path: Optional[str], num_steps: int, height: int, width: int,
                      frames: int = 0) -> torch.Tensor:
    from digenrl.models.diffusers_adapters import policy_class
    from digenrl.models.diffusers_adapters.sigmas import (load_scheduler, pipeline_sigmas, sample_sigmas, vae_factor,
                                                          vae_temporal_factor)

    cls = policy_class(family)
    default_h, default_w = cls.default_size
    factor = vae_factor(path)
    latent_hw = ((height or default_h) // factor, (width or default_w) // factor)
    latent_frames = ((frames or cls.default_num_frames) - 1) // vae_temporal_factor(path, 8) + 1  # read by ltx2 only
    return pipeline_sigmas(family, num_steps, load_scheduler(family, path), latent_hw, sample_sigmas(path),
                           latent_frames=latent_frames)


def sampling_sigmas(model: Any, sampling: Any, num_steps: int) -> torch.Tensor:
    """The sigma grid of a run: float32 (num_steps + 1,), 1 -> 0. `model` and `sampling` are
    a Config's sections of those names (read by attribute, as in `build_policy`).

    sampling.sigmas=digenrl: shift(linspace(1, 0, N+1)) with sampling.shift
    (digenrl.math.sigma_schedule). diffusers: the grid model.name's diffusers pipeline builds
    from model.path's scheduler config at model.height x model.width
    (digenrl/models/diffusers_adapters/sigmas.py). A pure function of the config: the driver,
    the trainer and the evaluator compute the same grid.
    """
    if sampling.sigmas == "digenrl":
        return sigma_schedule(num_steps, sampling.shift)
    return _diffusers_sigmas(model.name, model.path, num_steps, model.height, model.width,
                             getattr(model, "frames", 0)).clone()

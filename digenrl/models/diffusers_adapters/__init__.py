"""Policies over diffusers transformers: FLUX.1, SD3.5, Wan2.1, Qwen-Image, HunyuanVideo,
Wan2.2 A14B (two experts), FLUX.2 Klein, Z-Image, FLUX.2-dev, Qwen-Image 2.1, SANA,
SANA-Video, HunyuanVideo 1.5, LTX-2 (video + audio), Cosmos-Predict2.5 (text-to-world), and the
conditioned FLUX.1 Kontext, Qwen-Image-Edit, Wan2.1 I2V and HunyuanVideo 1.5 I2V.

    policy = load_policy("flux", "/models/FLUX.1-dev", height=512, width=512, train="lora")
    cond = policy.encode_prompts(["a cat"])             # Cond, batch-first
    v = policy.velocity(x, sigma, cond)                  # float32 (B, *policy.latent_shape)

Each family lives in its own file with the diffusers source lines its timestep, sign and
packing conventions come from. `base.py` holds what they share.
"""

from __future__ import annotations

import importlib
from typing import Any

FAMILIES = {
    "flux": ("digenrl.models.diffusers_adapters.flux", "FluxPolicy"),
    "sd3": ("digenrl.models.diffusers_adapters.sd3", "SD3Policy"),
    "wan": ("digenrl.models.diffusers_adapters.wan", "WanPolicy"),
    "qwen-image": ("digenrl.models.diffusers_adapters.qwen_image", "QwenImagePolicy"),
    "hunyuan-video": ("digenrl.models.diffusers_adapters.hunyuan_video", "HunyuanVideoPolicy"),
    "wan2.2": ("digenrl.models.diffusers_adapters.wan22", "Wan22Policy"),
    "flux2-klein": ("digenrl.models.diffusers_adapters.flux2_klein", "Flux2KleinPolicy"),
    "z-image": ("digenrl.models.diffusers_adapters.z_image", "ZImagePolicy"),
    "flux2": ("digenrl.models.diffusers_adapters.flux2", "Flux2Policy"),
    "qwen-image-2.1": ("digenrl.models.diffusers_adapters.qwen_image21", "QwenImage21Policy"),
    "sana": ("digenrl.models.diffusers_adapters.sana", "SanaPolicy"),
    "sana-video": ("digenrl.models.diffusers_adapters.sana", "SanaVideoPolicy"),
    "hunyuan-video-1.5": ("digenrl.models.diffusers_adapters.hunyuan_video15", "HunyuanVideo15Policy"),
    # video with an audio track: the trajectory latent holds both streams (ltx2.py)
    "ltx2": ("digenrl.models.diffusers_adapters.ltx2", "LTX2Policy"),
    "cosmos-predict2.5": ("digenrl.models.diffusers_adapters.cosmos_predict25", "CosmosPredict25Policy"),
    # conditioned: one image per prompt (protocol.encode_inputs)
    "flux-kontext": ("digenrl.models.diffusers_adapters.flux_kontext", "FluxKontextPolicy"),
    "qwen-image-edit": ("digenrl.models.diffusers_adapters.qwen_image_edit", "QwenImageEditPolicy"),
    "wan-i2v": ("digenrl.models.diffusers_adapters.wan_i2v", "WanI2VPolicy"),
    "hunyuan-video-1.5-i2v": ("digenrl.models.diffusers_adapters.hunyuan_video15_i2v", "HunyuanVideo15I2VPolicy"),
}
# what each conditioned family's image is (the classes' `conditioning`), readable without
# importing diffusers: config checks that data rows carry images exactly for these
CONDITIONING = {"flux-kontext": "reference-image", "qwen-image-edit": "reference-image", "wan-i2v": "first-frame",
                "hunyuan-video-1.5-i2v": "first-frame"}
# families whose transformer takes a guidance scale as an input (guidance-distilled:
# FLUX.1-dev, HunyuanVideo, FLUX.2-dev): their classes set `embedded_guidance`; ModelConfig
# reads this without importing diffusers
EMBEDDED_GUIDANCE = ("flux", "hunyuan-video", "flux-kontext", "flux2")
# families whose samples are videos, (B, F, 3, H, W) from decode (model.frames acts); readable
# without importing diffusers
VIDEO_FAMILIES = ("wan", "hunyuan-video", "wan2.2", "wan-i2v", "sana-video", "hunyuan-video-1.5",
                  "hunyuan-video-1.5-i2v", "ltx2", "cosmos-predict2.5")
# families whose samples carry an audio track besides the video (their classes set
# `audio_sample_rate` and have `decode_audio`); readable without importing diffusers
AUDIO_FAMILIES = ("ltx2",)
# families with a high- and a low-noise transformer (model.experts picks which train)
TWO_EXPERTS = ("wan2.2",)
EXPERT_CHOICES = ("both", "high", "low")  # the trained expert(s): AdapterOptions.experts, model.experts
_REQUIRED = ("diffusers", "transformers", "peft", "safetensors")


def policy_class(family: str) -> type:
    """The adapter class of a family name (see FAMILIES)."""
    if family not in FAMILIES:
        raise ValueError(f"model family {family!r} unknown; allowed: {', '.join(FAMILIES)}")
    for package in _REQUIRED:
        try:
            importlib.import_module(package)
        except ImportError as e:
            raise ImportError(
                f"the {family} adapter needs the package {package!r}: "
                f"pip install 'diffusers>=0.35' 'transformers>=4.45' 'peft>=0.13' safetensors"
            ) from e
    module, name = FAMILIES[family]
    return getattr(importlib.import_module(module), name)


# ModelConfig's names for two options (digenrl/config/schema.py), accepted as aliases
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
    classes = {cls: (mod, cls) for mod, cls in FAMILIES.values()}
    if name in classes:
        mod, cls = classes[name]
        return getattr(importlib.import_module(mod), cls)
    if name in ("AdapterOptions", "DiffusersPolicy", "DEFAULT_LORA_TARGETS"):
        return getattr(importlib.import_module("digenrl.models.diffusers_adapters.base"), name)
    if name == "PromptCache":
        return importlib.import_module("digenrl.models.diffusers_adapters.prompt_cache").PromptCache
    raise AttributeError(name)


__all__ = [
    "AUDIO_FAMILIES", "VIDEO_FAMILIES", "CONDITIONING", "EMBEDDED_GUIDANCE", "EXPERT_CHOICES", "FAMILIES", "TWO_EXPERTS",
    "default_lora_targets", "load_policy", "policy_class",
    "FluxPolicy", "SD3Policy", "WanPolicy", "QwenImagePolicy", "HunyuanVideoPolicy",
    "Wan22Policy", "Flux2KleinPolicy", "ZImagePolicy",
    "Flux2Policy", "QwenImage21Policy", "SanaPolicy", "SanaVideoPolicy", "HunyuanVideo15Policy",
    "HunyuanVideo15I2VPolicy", "LTX2Policy", "CosmosPredict25Policy",
    "FluxKontextPolicy", "QwenImageEditPolicy", "WanI2VPolicy",
    "AdapterOptions", "DiffusersPolicy", "PromptCache",
]

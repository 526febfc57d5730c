"""What is profiled: one generator (policy + batch-1 condition) and the names its records carry."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from digenrl.models.families import FAMILIES
from digenrl.models.protocol import Cond

# the families `digenrl profile` is built for: those whose record gives `joint_text` (not a
# conditioned one, nor ltx2; digenrl.models.families says why)
DIFFUSERS_FAMILIES = tuple(n for n, f in FAMILIES.items() if f.joint_text is not None)
# VAE calibration entries the cost model reads, and the one shape each was measured at
CALIB_VAES = {"flux": ("flux-vae", (1024, 1024, 1)), "wan": ("wan-vae", (480, 832, 33))}


@dataclass
class Target:
    """One generator to profile and what the records say about it."""

    name: str  # the record's "model"
    policy: Any
    cond: Cond  # batch 1
    params_B: float
    tokens: int
    shape: str
    family: str  # "tiny-dit" or a diffusers family
    grad_ckpt: bool  # the module supports gradient checkpointing
    vae_name: Optional[str] = None
    vae_what: Optional[str] = None
    lora_targets: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


def cost_model_name(family: str, params_B: float) -> Optional[str]:
    """The digenrl.sim.catalogue.MODELS entry this family and size is (within 10% of its params)."""
    from digenrl.sim.catalogue import MODELS, family_models

    for name in family_models(family):
        if abs(params_B / MODELS[name].params_B - 1.0) < 0.10:
            return name
    return None


def _tokens(latent_shape: tuple[int, ...], text: int, patch: int = 2) -> int:
    """Sequence length: patch x patch latent patches (x latent frames for video) + text tokens in
    the joint sequence."""
    *lead, h, w = latent_shape
    frames = lead[1] if len(lead) == 2 else 1
    return frames * (h // patch) * (w // patch) + text


def tiny_dit_target(policy, name: Optional[str] = None) -> Target:
    """The records' description of a TinyDiTPolicy (all parameters counted, LoRA included)."""
    from digenrl.models.tiny_dit import LORA_TARGETS

    c = policy.module.config
    tokens = (c.image_size // c.patch) ** 2 + c.max_tokens  # patches + prompt tokens in one sequence
    params_B = sum(p.numel() for p in policy.module.parameters()) / 1e9
    shape = f"{c.image_size}x{c.image_size}, {c.max_tokens} text tokens"
    return Target(name or "tiny-dit", policy, policy.negative_cond(1), params_B, tokens, shape, "tiny-dit",
                  hasattr(policy.module, "enable_gradient_checkpointing"), lora_targets=LORA_TARGETS)


def diffusers_target(policy, cond: Cond, family: str, name: Optional[str], tiny: bool,
                     log: Callable[[str], None] = print) -> Target:
    """The records' names, token count and shape string of a diffusers policy (see digenrl.profile.cli)."""
    from digenrl.sim.catalogue import MODELS, Shape

    params_B = sum(p.numel() for p in policy.module.parameters()) / 1e9
    video = policy.output == "video"
    text = int(cond["prompt_embeds"].shape[1]) if FAMILIES[family].joint_text else 0
    shape = Shape(policy.height, policy.width, policy.num_frames if video else 1)
    notes = []
    if name is None:
        known = cost_model_name(family, params_B)
        name = known or f"{family}-{params_B:.2f}b"
        if tiny:
            name = f"{known or family}-tiny"
        elif known and shape != MODELS[known].calib_shape:
            name = f"{known}@{shape.height}x{shape.width}" + (f"x{shape.frames}" if video else "")
            notes.append(f"shape differs from the cost model's calibration shape {MODELS[known].calib_shape}: "
                         f"records named {name!r}, which CostModel does not read")
        elif not known:
            notes.append(f"no cost-model entry for {family} at {params_B:.2f}B parameters: records named {name!r}")
    elif name in MODELS and shape != MODELS[name].calib_shape:
        notes.append(f"records named {name!r} but measured at {shape}; CostModel assumes {MODELS[name].calib_shape}")
    vae_name, vae_what = None, None
    if getattr(policy, "vae", None) is not None:
        calib = CALIB_VAES.get(family)
        if calib and (shape.height, shape.width, shape.frames) == calib[1] and not tiny:
            vae_name = calib[0]
        else:
            vae_name = f"{name}-vae"
        vae_what = (f"decode-{shape.frames}f-{shape.height}x{shape.width}" if video
                    else (f"decode-{shape.height}px" if shape.height == shape.width
                          else f"decode-{shape.height}x{shape.width}"))
    for n in notes:
        log(f"note: {n}")
    shape_str = f"{shape.frames} frames {shape.height}x{shape.width}" if video else \
        f"{shape.height}x{shape.width}, {text} text tokens"
    tokens = _tokens(policy.latent_shape, text, FAMILIES[family].latent_patch)
    return Target(name, policy, cond, params_B, tokens, shape_str, family,
                  hasattr(policy.module, "enable_gradient_checkpointing"), vae_name, vae_what,
                  tuple(policy.default_lora_targets), notes)


def load_target(args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                log: Callable[[str], None] = print) -> Target:
    """The generator named by --model/--arch, --path / --random, --tiny."""
    model = args.model
    if model == "tiny-dit":
        from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig, TinyDiTPolicy

        if args.path:
            from digenrl.toy.pretrain import load_tiny_dit

            module = load_tiny_dit(Path(args.path))
        else:  # the weights do not change the cost: a random init of the toy architecture
            torch.manual_seed(0)
            module = TinyDiT(TinyDiTConfig())
        return tiny_dit_target(TinyDiTPolicy(module.to(dtype), str(device)), args.name)
    explicit_shape = args.height or args.width or args.frames
    if args.random:
        from digenrl.models.diffusers_adapters.configs import ARCHS, build_random

        if model not in ARCHS:
            raise SystemExit(f"--random builds only {', '.join(ARCHS)} (inline configs); for {model} pass --path")
        opts = {k: v for k, v in (("height", args.height), ("width", args.width)) if v}
        policy, cond = build_random(model, args.tiny, device, dtype, vae=True, **opts)
        return diffusers_target(policy, cond, model, args.name, args.tiny, log)
    if not args.path:
        raise SystemExit(f"--model {model}: pass --path <diffusers pipeline folder> (or --random for sd3/flux)")
    from digenrl.models.diffusers_adapters import load_policy
    from digenrl.sim.catalogue import MODELS, family_models

    # default shape: the cost model's calibration shape for this family, if the size is known
    shape_opts = {}
    if not explicit_shape:
        specs = [MODELS[n] for n in family_models(model)]
        if len(specs) == 1 or (specs and all(s.calib_shape == specs[0].calib_shape for s in specs)):
            s = specs[0].calib_shape
            shape_opts = dict(height=s.height, width=s.width) | (dict(frames=s.frames) if s.frames > 1 else {})
    else:
        shape_opts = {k: v for k, v in (("height", args.height), ("width", args.width), ("frames", args.frames)) if v}
    # with a prompt cache the text encoders are not loaded (a trainer's setup; no encode timing)
    policy = load_policy(model, args.path, device=str(device), dtype=dtype, train="full",
                         prompt_cache=args.prompt_cache, text_encoders=args.prompt_cache is None, **shape_opts)
    cond = {k: v[:1] for k, v in policy.encode_prompts(["a photo of a cat"]).items()}
    return diffusers_target(policy, cond, model, args.name, args.tiny, log)

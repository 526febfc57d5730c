"""The one protocol every generator implements, and helpers over prompt conditions.

A policy is a velocity field v(x, sigma | prompt) plus what the RL loop needs around it:
turning prompts into condition tensors, the latent shape to sample, and decoding final
latents into images or videos for the rewards. The tiny DiT and every diffusers adapter
implement it; rollout, learner and runtime see nothing else.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

# Condition tensors, all batch-first (B, ...): they slice, concatenate and serialize
# (safetensors) without knowing the model. A prompt-embedding cache stores exactly this.
Cond = dict[str, torch.Tensor]


@runtime_checkable
class Policy(Protocol):
    module: torch.nn.Module  # the denoiser; RL updates its trainable parameters
    latent_shape: tuple[int, ...]  # per sample: (C, H, W) for images, (C, F, H, W) for video
    output: str  # "image" or "video"

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        """Prompts -> condition tensors, batch-first, on the policy's device."""
        ...

    def negative_cond(self, batch: int) -> Cond:
        """The unconditional (empty or negative prompt) condition for classifier-free guidance."""
        ...

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        """Predicted velocity (eps - x0) at x (B, *latent_shape), sigma (B,) in [0, 1].

        sigma is the flow-matching noise level; converting it to the model's own timestep
        convention happens here, once, and nowhere else.
        """
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents -> float32 pixels in [0, 1]: (B, 3, H, W) or (B, F, 3, H, W)."""
        ...


def cond_select(cond: Cond, index: torch.Tensor | Sequence[int] | slice) -> Cond:
    return {k: v[index] for k, v in cond.items()}


def cond_cat(conds: Sequence[Cond]) -> Cond:
    keys = conds[0].keys()
    for c in conds[1:]:
        if c.keys() != keys:
            raise ValueError(f"cannot concatenate conditions with keys {sorted(keys)} and {sorted(c.keys())}")
    return {k: torch.cat([c[k] for c in conds]) for k in keys}


def cond_repeat(cond: Cond, repeats: int) -> Cond:
    """Each row repeated `repeats` times in place (a prompt -> its group of samples)."""
    return {k: v.repeat_interleave(repeats, dim=0) for k, v in cond.items()}


def cond_to(cond: Cond, device: torch.device | str) -> Cond:
    return {k: v.to(device) for k, v in cond.items()}


def guided_velocity(
    policy: Policy,
    x: torch.Tensor,
    sigma: torch.Tensor,
    cond: Cond,
    negative: Cond | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Classifier-free guidance: v_neg + scale (v_cond - v_neg), both in one batched call.

    scale == 1 (or no negative) is the plain conditional velocity; models with embedded
    guidance (FLUX.1-dev) carry it inside `cond` and use scale 1 here.
    """
    if scale == 1.0 or negative is None:
        return policy.velocity(x, sigma, cond)
    v = policy.velocity(torch.cat([x, x]), torch.cat([sigma, sigma]), cond_cat([cond, negative]))
    v_cond, v_neg = v.chunk(2)
    return v_neg + scale * (v_cond - v_neg)

"""One denoising step of a rectified flow, deterministic or stochastic, with its log-prob.

Convention (rectified flow, as Flow-GRPO and diffusers' flow-matching schedulers): x_s = (1 - s) x0 + s eps, s runs from 1 (noise) to 0
(data), the model predicts v ~ eps - x0, and a step goes from sigma to sigma_next < sigma
with D = sigma - sigma_next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from digenrl.math.kinds import SDE_KINDS

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

Sigma = Union[float, torch.Tensor]


@dataclass
class StepOut:
    prev_sample: torch.Tensor  # (B, ...) float32: x at sigma_next
    log_prob: Optional[torch.Tensor]  # (B,) float32, averaged over non-batch dims; None for ode
    mean: torch.Tensor  # (B, ...) float32
    std: torch.Tensor  # (B, 1, ..., 1) float32, broadcastable to mean


def _per_sample(value: Sigma, like: torch.Tensor) -> torch.Tensor:
    """A float or (B,) tensor as float32 (B, 1, ..., 1) on like's device."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if t.ndim == 0:
        t = t.expand(like.shape[0])
    if t.shape != (like.shape[0],):
        raise ValueError(f"sigma must be a float or a ({like.shape[0]},) tensor, got shape {tuple(t.shape)}")
    return t.reshape(-1, *([1] * (like.ndim - 1)))


def _mean_over_sample(t: torch.Tensor) -> torch.Tensor:
    return t.mean(dim=tuple(range(1, t.ndim)))


def sde_step(
    x: torch.Tensor,
    velocity: torch.Tensor,
    sigma: Sigma,
    sigma_next: Sigma,
    *,
    kind: str,
    noise_level: float,
    generator: Optional[torch.Generator] = None,
    prev_sample: Optional[torch.Tensor] = None,
    noise: Optional[torch.Tensor] = None,
    check: bool = True,
) -> StepOut:
    """Step x from sigma to sigma_next and score the result.

    If `prev_sample` is given it is scored instead of sampled (the training-time
    recomputation); else the step draws `noise` (explicit standard normals, as the
    sampler passes for layout-independent randomness) or from `generator`.

    noise_level is `a` for flow-sde and cps and `eta` for dance-sde (ignored for ode).
    The log-prob of cps is the surrogate -mean((x' - mean)^2) of the CPS paper.
    check=False skips the sigma_next < sigma check (a read of device values back to the host):
    for a caller that checked its schedule already (the learner, once per unit).
    """
    if kind not in SDE_KINDS:
        raise ValueError(f"sde kind {kind!r} unknown; allowed: {', '.join(SDE_KINDS)}")
    if x.shape != velocity.shape:
        raise ValueError(f"x {tuple(x.shape)} and velocity {tuple(velocity.shape)} must have the same shape")
    x = x.float()
    v = velocity.float()
    s = _per_sample(sigma, x)
    s_next = _per_sample(sigma_next, x)
    dt = s - s_next  # D > 0
    if check and bool((dt <= 0).any()):
        raise ValueError("sigma_next must be smaller than sigma")

    if kind == "ode":
        mean = x - dt * v
        std = torch.zeros_like(s)
    elif kind == "flow-sde":
        # at s = 1 the 1/(1-s) blows up; Flow-GRPO uses 1 - sigma_next there instead
        denom = torch.where(s >= 1.0, 1.0 - s_next, 1.0 - s)
        g = noise_level * torch.sqrt(s / denom)
        mean = x * (1.0 - g**2 * dt / (2.0 * s)) - dt * v * (1.0 + g**2 * (1.0 - s) / (2.0 * s))
        std = g * torch.sqrt(dt)
    elif kind == "dance-sde":
        mean = x - dt * (v + noise_level**2 / (2.0 * s) * (x + (1.0 - s) * v))
        std = noise_level * torch.sqrt(dt)
    else:  # cps
        x0_hat = x - s * v
        x1_hat = x + (1.0 - s) * v
        std = s_next * math.sin(noise_level * math.pi / 2.0)
        mean = (1.0 - s_next) * x0_hat + torch.sqrt(torch.clamp(s_next**2 - std**2, min=0.0)) * x1_hat

    if prev_sample is None:
        if kind == "ode":
            prev_sample = mean
        else:
            if noise is None:
                noise = torch.randn(mean.shape, generator=generator, dtype=torch.float32).to(mean.device)
            prev_sample = mean + std * noise.to(mean.device, torch.float32)
    prev_sample = prev_sample.float()

    if kind == "ode":
        log_prob = None
    elif kind == "cps":
        log_prob = -_mean_over_sample((prev_sample.detach() - mean) ** 2)
    else:
        log_prob = _mean_over_sample(
            -((prev_sample.detach() - mean) ** 2) / (2.0 * std**2) - torch.log(std) - _LOG_SQRT_2PI
        )
    return StepOut(prev_sample=prev_sample, log_prob=log_prob, mean=mean, std=std)

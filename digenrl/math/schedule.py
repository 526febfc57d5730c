"""Sigma schedules. The choice of which denoising steps are stochastic and trained (SdeWindow)
is in `digenrl.math.window`, which needs no torch."""

from __future__ import annotations

import torch

from digenrl.math.window import WINDOW_DRAWS, WINDOW_KINDS, SdeWindow  # noqa: F401 (re-exported)


def sigma_schedule(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """sigmas[0] = 1 (noise) ... sigmas[num_steps] = 0 (data), float32, length num_steps+1.

    linspace(1, 0) then the SD3 time shift s <- k s / (1 + (k-1) s); k > 1 spends more
    steps at high noise, which large-resolution models need.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    s = shift * s / (1.0 + (shift - 1.0) * s)
    return s.to(torch.float32)

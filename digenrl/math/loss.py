"""The clipped GRPO objective on (sample, denoising step) units, and the KL to a reference."""

from __future__ import annotations

from typing import Optional

import torch


def gaussian_mean_kl(mean: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, std^2) || N(mean_ref, std^2)) averaged over non-batch dims: (B,).

    Both Gaussians share std, so the KL is (mean - mean_ref)^2 / (2 std^2). Computed with
    gradient through `mean` (a KL under no_grad is a known trap: it would not regularise).
    """
    per_elem = (mean.float() - mean_ref.float().detach()) ** 2 / (2.0 * std.float() ** 2)
    return per_elem.mean(dim=tuple(range(1, per_elem.ndim)))


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_range: float,
    kl: Optional[torch.Tensor] = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip loss averaged over the units given (all (B,)), plus beta * KL.

    logp: current policy; logp_old: behaviour (rollout) policy, whose log-probs were
    recorded at generation time; advantages: per sample, detached.
    """
    logratio = logp - logp_old.detach()
    ratio = torch.exp(logratio)
    adv = advantages.detach()
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    pg_loss = torch.maximum(pg_loss1, pg_loss2).mean()
    loss = pg_loss
    kl_mean = torch.zeros((), device=logp.device)
    if kl is not None:
        kl_mean = kl.mean()
        loss = loss + beta * kl_mean
    with torch.no_grad():
        metrics = {
            "loss/policy": pg_loss.detach(),
            "loss/kl": kl_mean.detach(),
            "loss/clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean(),
            "loss/ratio_mean": ratio.mean(),
            "loss/ratio_max": ratio.max(),
            "loss/approx_kl": 0.5 * (logratio**2).mean(),
        }
    return loss, metrics

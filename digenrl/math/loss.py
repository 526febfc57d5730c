"""The clipped GRPO objective on (sample, denoising step) units, its GRPO-Guard variant,
and the KL to a reference."""

from __future__ import annotations

from typing import Optional, Union

import torch

LOSS_KINDS = ("grpo", "grpo-guard")


def gaussian_mean_kl(mean: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, std^2) || N(mean_ref, std^2)) averaged over non-batch dims: (B,).

    Both Gaussians share std, so the KL is (mean - mean_ref)^2 / (2 std^2). Computed with
    gradient through `mean` (a KL under no_grad is a known trap: it would not regularise).
    """
    per_elem = (mean.float() - mean_ref.float().detach()) ** 2 / (2.0 * std.float() ** 2)
    return per_elem.mean(dim=tuple(range(1, per_elem.ndim)))


def _clipped(ratio: torch.Tensor, adv: torch.Tensor, clip_range: float) -> torch.Tensor:
    """PPO-clip loss per unit, (B,): max(-A r, -A clip(r, 1 - eps, 1 + eps))."""
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(pg_loss1, pg_loss2)


def _with_kl(
    pg_loss: torch.Tensor, ratio: torch.Tensor, logratio: torch.Tensor, clip_range: float,
    kl: Optional[torch.Tensor], beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """pg_loss + beta * mean KL, and the metrics both losses report."""
    loss = pg_loss
    kl_mean = torch.zeros((), device=pg_loss.device)
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
    pg_loss = _clipped(ratio, advantages.detach(), clip_range).mean()
    return _with_kl(pg_loss, ratio, logratio, clip_range, kl, beta)


def grpo_guard_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mean: torch.Tensor,
    mean_old: torch.Tensor,
    std: torch.Tensor,
    dt: Union[float, torch.Tensor],
    clip_range: float,
    kl: Optional[torch.Tensor] = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-Guard (Wang et al. 2025, arXiv 2510.22319): RatioNorm + gradient reweighting.

    The Gaussian step x' ~ N(mean_old, std^2) of the behaviour policy gives, with
    x' = mean_old + std * eps and d = mean - mean_old (elementwise, then averaged over
    the sample's dims like the log-probs):

        log r = mean(d * eps) / std - mean(d^2) / (2 std^2)

    so r has mean below 1 (the -mean(d^2) / (2 std^2) drift) and a spread that scales with
    1 / std, which differs per denoising step. RatioNorm adds the drift back and rescales
    by std:

        bias  = mean((mean - mean_old)^2) / (2 std^2)                     (B,)
        r_hat = exp(std * (log r + bias))            [= exp(mean(d * eps))]
        loss  = mean_B( max(-A r_hat, -A clip(r_hat, 1 - eps, 1 + eps)) ) / dt

    and the 1 / dt factor is the gradient reweighting: the mean's velocity coefficient is
    dt * beta_t, so d r_hat / d v ~ dt * beta_t, and 1 / dt evens it over steps (the
    Flow-GRPO form, where beta = 1 + a^2 / 2 is a constant that the learning rate absorbs;
    dance-sde gets the same 1 / dt, its beta_t = 1 + eta^2 (1 - s) / (2 s) is left in).
    The paper's PDF was not readable here: the formulas are those of the peers'
    implementations, which agree: verl-omni's GRPOGuardLoss
    (verl_omni/trainer/diffusion/diffusion_algos.py, documented in docs algo/grpo_guard.md
    with these three equations), Flow-Factory's GRPOGuardTrainer.optimize
    (src/flow_factory/trainers/grpo.py, ratio only, no 1 / dt) and TeleBoost's
    grpo_guard.py (which numbers them the paper's Eq. 8 and Eq. 12).

    Shapes: logp, logp_old, advantages (B,); mean, mean_old (B, ...) the current and the
    behaviour policy's SDE means of this step; std (B, 1, ..., 1) or (B,) the step's
    Gaussian std (`StepOut.std`: g sqrt(dt) for flow-sde, eta sqrt(dt) for dance-sde);
    dt = sigma - sigma_next, a float or (B,). Everything is per unit (sample, step): no
    statistic spans rows, so how units cut a batch never changes a unit's loss term.
    Gradient flows through logp and through `mean` in the bias; logp_old, mean_old and
    the advantages are detached.

    Reduction to grpo: with std = 1, dt = 1 and mean = mean_old (bias 0) it is grpo_loss;
    on-policy (mean = mean_old, ratio 1) its gradient is std / dt times grpo_loss's.
    """
    logratio = logp - logp_old.detach()
    b = logp.shape[0]
    scale = std.float().reshape(b, -1)[:, 0]  # (B,): one std per unit
    drift = ((mean.float() - mean_old.float().detach()) ** 2).reshape(b, -1).mean(dim=1)  # (B,)
    bias = drift / (2.0 * scale**2)
    ratio = torch.exp(scale * (logratio + bias))
    dt_ = torch.as_tensor(dt, dtype=torch.float32, device=logp.device).expand(b)
    pg_loss = (_clipped(ratio, advantages.detach(), clip_range) / dt_).mean()
    loss, metrics = _with_kl(pg_loss, ratio, logratio, clip_range, kl, beta)
    metrics["loss/guard_bias"] = bias.detach().mean()
    return loss, metrics

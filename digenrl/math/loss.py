"""The clipped GRPO objective on (sample, denoising step) units, its GRPO-Guard variant,
the KL to a reference, DiffusionNFT's forward-process objective and Advantage Weighted
Matching's."""

from __future__ import annotations

from typing import Optional, Union

import torch

from digenrl.math.kinds import AWM_WEIGHTINGS, CLEAN_SAMPLE_LOSSES, LOSS_KINDS


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


def _weighted(per_row: torch.Tensor, is_weights: Optional[torch.Tensor]) -> torch.Tensor:
    """per_row * is_weights (detached), or per_row as is; (B,)."""
    return per_row if is_weights is None else per_row * is_weights.detach().to(per_row.dtype)


def _with_kl(
    pg_loss: torch.Tensor, ratio: torch.Tensor, logratio: torch.Tensor, clip_range: Optional[float],
    kl: Optional[torch.Tensor], beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """pg_loss + beta * mean KL, and the metrics the ratio losses report (clip_range None: a
    loss without a ratio clip, no clip fraction)."""
    loss = pg_loss
    kl_mean = torch.zeros((), device=pg_loss.device)
    if kl is not None:
        kl_mean = kl.mean()
        loss = loss + beta * kl_mean
    with torch.no_grad():
        metrics = {
            "loss/policy": pg_loss.detach(),
            "loss/kl": kl_mean.detach(),
            **({} if clip_range is None else {"loss/clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean()}),
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
    is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip loss averaged over the units given (all (B,)), plus beta * KL.

    logp: current policy; logp_old: behaviour policy (the rollout's recorded log-probs, or
    the trainer's own: train.behaviour_logp); advantages: per sample, detached. is_weights:
    (B,) detached per-row weights of the rollout correction (math.consistency), None = 1.
    """
    logratio = logp - logp_old.detach()
    ratio = torch.exp(logratio)
    pg_loss = _weighted(_clipped(ratio, advantages.detach(), clip_range), is_weights).mean()
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
    is_weights: Optional[torch.Tensor] = None,
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
    the advantages are detached. is_weights: as in grpo_loss.

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
    pg_loss = _weighted(_clipped(ratio, advantages.detach(), clip_range) / dt_, is_weights).mean()
    loss, metrics = _with_kl(pg_loss, ratio, logratio, clip_range, kl, beta)
    metrics["loss/guard_bias"] = bias.detach().mean()
    return loss, metrics


def nft_optimality(advantages: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """DiffusionNFT's optimality probability r = 1/2 + clip(A, -c, c) / (2c) in [0, 1], (B,)."""
    return 0.5 + 0.5 * torch.clamp(advantages.detach().float() / adv_clip, -1.0, 1.0)


def nft_loss(
    v: torch.Tensor,
    v_old: torch.Tensor,
    x_t: torch.Tensor,
    x0: torch.Tensor,
    sigma: torch.Tensor,
    advantages: torch.Tensor,
    *,
    beta: float,
    adv_clip: float,
    v_ref: Optional[torch.Tensor] = None,
    kl_beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117) on forward-process targets.

    A clean rollout sample x0 is noised along the forward process, x_t = (1 - s) x0 + s eps,
    and the velocity v = v_theta(x_t, s) is split into an implicit positive and negative
    policy around the old (sampling) policy's v_old:

        v+ = beta v + (1 - beta) v_old          v- = (1 + beta) v_old - beta v
        x0+ = x_t - s v+                        x0- = x_t - s v-
        w+- = max(mean|x0+- - x0|, 1e-5)        (adaptive weight, detached)
        r   = 1/2 + clip(A, -c, c) / (2c)       (optimality probability, c = adv_clip)
        loss = c / beta * mean_B( r mean((x0+ - x0)^2) / w+ + (1 - r) mean((x0- - x0)^2) / w- )
               + kl_beta * mean_B( mean((v - v_ref)^2) )

    The x0-space form with the adaptive weight and the c / beta scale are those of the
    authors' code (NVlabs/DiffusionNFT, scripts/train_nft_sd3.py); the KL is their
    velocity MSE to the reference (base) model. On the policy that sampled (v = v_old in
    value) the loss is c / beta * mean(|x0_hat - x0|^2) / w, and its gradient in v is
    -2 s A' (x0_hat - x0) / (w D) per sample with A' = clip(A, -c, c) and D the element
    count, whatever beta: a reward-weighted regression of x0_hat towards good samples and
    away from bad ones.

    Shapes: v, v_old, x_t, x0, v_ref (B, ...); sigma (B,) the noise level of each row;
    advantages (B,). v_old, v_ref, x_t, x0 and the advantages are detached. Per row: no
    statistic spans rows, so how units cut a batch never changes a row's term.
    """
    b = v.shape[0]
    dims = tuple(range(1, v.ndim))
    s = sigma.float().reshape(b, *([1] * (v.ndim - 1)))
    v32, v_old = v.float(), v_old.detach().float()
    x_t, x0 = x_t.detach().float(), x0.detach().float()
    r = nft_optimality(advantages, adv_clip)
    x0_pos = x_t - s * (beta * v32 + (1.0 - beta) * v_old)
    x0_neg = x_t - s * ((1.0 + beta) * v_old - beta * v32)
    with torch.no_grad():
        w_pos = (x0_pos - x0).abs().mean(dim=dims, keepdim=True).clamp(min=1e-5)
        w_neg = (x0_neg - x0).abs().mean(dim=dims, keepdim=True).clamp(min=1e-5)
    pos = ((x0_pos - x0) ** 2 / w_pos).mean(dim=dims)  # (B,)
    neg = ((x0_neg - x0) ** 2 / w_neg).mean(dim=dims)
    policy = (adv_clip / beta * (r * pos + (1.0 - r) * neg)).mean()
    loss = policy
    kl_mean = torch.zeros((), device=v.device)
    if v_ref is not None:
        kl_mean = ((v32 - v_ref.detach().float()) ** 2).mean(dim=dims).mean()
        loss = loss + kl_beta * kl_mean
    with torch.no_grad():
        metrics = {
            "loss/policy": policy.detach(),
            "loss/kl": kl_mean.detach(),
            "loss/nft_r_mean": r.mean(),
            "loss/nft_positive": pos.mean(),
            "loss/nft_negative": neg.mean(),
            "loss/nft_old_deviation": ((v32 - v_old) ** 2).mean(),
        }
    return loss, metrics


def nft_old_decay(updates: int, ceiling: float, rate: float, flat: int) -> float:
    """DiffusionNFT's old-policy decay d after `updates` optimizer steps: the old policy is then
    refreshed as old <- d old + (1 - d) new.

        d = 0                                      updates < flat
        d = min((updates - flat) * rate, ceiling)  otherwise

    The authors' `return_decay(step, decay_type)` (NVlabs/DiffusionNFT@24af555
    scripts/train_nft_sd3.py:169-189), called with their global_step after the epoch's
    gradient steps (:1035-1040): decay_type 0 is ceiling 0 (the old policy is the new one),
    1 is (flat 0, rate 0.001, ceiling 0.5), 2 is (flat 75, rate 0.0075, ceiling 0.999).
    """
    if updates < flat:
        return 0.0
    return min((updates - flat) * rate, ceiling)


# -- AWM ---------------------------------------------------------------------------------
def awm_log_likelihood(v: torch.Tensor, target: torch.Tensor, sigma: torch.Tensor, *, weighting: str = "uniform",
                       ghuber_power: float = 0.25) -> torch.Tensor:
    """AWM's per-row surrogate log-likelihood of the clean sample, (B,): minus its weighted
    flow-matching error. With e = mean((v - target)^2) over the row's elements (target = eps - x0):

        uniform  -e                   t2      -e sigma^2
        t        -e sigma             ghuber  -((e + 1e-10)^p - 1e-10^p) sigma / p

    scxue/advantage_weighted_matching@be51372 advantage_weighted_matching/scripts/train_sd3_awm.py:210-252
    (compute_log_prob_awm; their names Uniform, t, t**2, ghuber; their huber is ghuber at
    p = 0.5 halved). Computed in float32 (theirs: float64).
    """
    b = v.shape[0]
    err = ((v.float() - target.detach().float()) ** 2).reshape(b, -1).mean(dim=1)  # (B,)
    s = sigma.detach().float().reshape(b)
    if weighting == "uniform":
        return -err
    if weighting == "t":
        return -err * s
    if weighting == "t2":
        return -err * s**2
    if weighting == "ghuber":
        p = ghuber_power
        return -((err + 1e-10) ** p - 1e-10**p) * s / p
    raise ValueError(f"AWM weighting {weighting!r} unknown; allowed: {', '.join(AWM_WEIGHTINGS)}")


def awm_loss(
    v: torch.Tensor,
    target: torch.Tensor,
    sigma: torch.Tensor,
    advantages: torch.Tensor,
    *,
    adv_clip: float,
    adv_max: float = 1.0,
    clip_range: float = 1.0,
    weighting: str = "uniform",
    ghuber_power: float = 0.25,
    logp_old: Optional[torch.Tensor] = None,
    v_ref: Optional[torch.Tensor] = None,
    kl_beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Advantage Weighted Matching (Xue et al. 2025, arXiv 2509.25050) on forward-process targets.

    A clean rollout sample x0 is noised afresh, x_t = (1 - s) x0 + s eps, and scored by the
    pretraining flow-matching error of v = v_theta(x_t, s) against target = eps - x0, as a
    log-likelihood surrogate logp (awm_log_likelihood). The authors wrap it in PPO's clip
    (scxue/advantage_weighted_matching@be51372 advantage_weighted_matching/scripts/train_sd3_awm.py:1301-1327,
    loss_type exp_first: one ratio per noise draw):

        A'    = clip(A, -c, c) * adv_max / c               (:1293-1299, c = adv_clip_max)
        ratio = exp(logp - logp_old)
        loss  = mean_B( max(-A' ratio, -A' clip(ratio, 1 - eps, 1 + eps)) )
                + kl_beta * mean_B( mean((v - v_ref)^2) )  (:1328-1352, kl_weight Uniform)

    On-policy (logp_old None: logp detached, the authors' off_policy=False, where each
    micro-batch's old log-prob is its own detached log-prob, :1227-1229 and :1282-1284,
    with gradient_accumulation_steps = num_batches_per_epoch in all their configs) the ratio is 1 in
    value and the gradient of the policy term in v is A' w'(e) 2 (v - target) / D per row
    (D elements; w'(e) = 1 for uniform): advantage-weighted flow matching, which pulls the
    velocity towards the sample's own noise-to-data direction where A > 0 and pushes it away
    where A < 0. logp_old (B,) gives the off-policy ratio.

    Shapes: v, target, v_ref (B, ...); sigma, advantages, logp_old (B,). Everything but v is
    detached. Per row: no statistic spans rows.
    """
    logp = awm_log_likelihood(v, target, sigma, weighting=weighting, ghuber_power=ghuber_power)
    logratio = logp - (logp.detach() if logp_old is None else logp_old.detach().float())
    ratio = torch.exp(logratio)
    adv = torch.clamp(advantages.detach().float(), -adv_clip, adv_clip) * (adv_max / adv_clip)
    policy = _clipped(ratio, adv, clip_range).mean()
    loss = policy
    kl_mean = torch.zeros((), device=v.device)
    if v_ref is not None:
        b = v.shape[0]
        kl_mean = ((v.float() - v_ref.detach().float()) ** 2).reshape(b, -1).mean(dim=1).mean()
        loss = loss + kl_beta * kl_mean
    with torch.no_grad():
        metrics = {
            "loss/policy": policy.detach(),
            "loss/kl": kl_mean.detach(),
            "loss/clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean(),
            "loss/ratio_mean": ratio.mean(),
            "loss/awm_logp": logp.detach().mean(),
        }
    return loss, metrics
# -- end AWM --
# -- Flow-DPPO ---------------------------------------------------------------------


def flow_dppo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    *,
    mean: torch.Tensor,
    mean_old: torch.Tensor,
    std: torch.Tensor,
    threshold: float,
    kl: Optional[torch.Tensor] = None,
    beta: float = 0.0,
    is_weights: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Flow-DPPO (arXiv 2606.11025): Flow-GRPO's ratio objective with PPO's clip replaced by
    a divergence trust region. The old and the current SDE step share their std, so their
    per-step divergence is the Gaussian KL of the means (elementwise mean, as the log-probs):

        D    = mean((mean - mean_old)^2) / (2 std^2)                       (B,)
        drop = D >= threshold  and  ((A > 0 and r > 1) or (A < 0 and r < 1))
        loss = mean_B( -A r  where not drop, else 0 )

    so a unit is cut only when it is past the threshold and still moving away from the
    behaviour policy; corrective updates stay. As veRL-Omni implements it (FlowDPPOLoss,
    verl-project/verl-omni@a1139baf verl_omni/trainer/diffusion/diffusion_algos.py:362-443,
    docs/algo/flowdppo.md, with add_kl_coefficient=True: D divided by the step's std^2) and UniRL's
    _flowdppo_kl_adv_loss (Tencent-Hunyuan/UniRL unirl/algorithms/flowdppo.py, the reference
    veRL-Omni's page cites; the same mask, threshold default 1e-5).

    Shapes as in grpo_guard_loss: logp, logp_old, advantages (B,); mean, mean_old (B, ...);
    std (B, 1, ...) or (B,). Gradient flows through logp only (the mask is detached); per
    unit, so how units cut a batch never changes a unit's term. Under one optimizer step per
    RL step, on-policy rows have mean = mean_old and r = 1: D = 0, nothing is dropped, and the
    gradient is grpo_loss's; the mask acts on rows trained one version late (run.mode=digenrl)
    and on a rollout-train precision gap.
    """
    logratio = logp - logp_old.detach()
    ratio = torch.exp(logratio)
    adv = advantages.detach()
    b = logp.shape[0]
    scale = std.float().reshape(b, -1)[:, 0]  # (B,)
    drift = ((mean.float() - mean_old.float().detach()) ** 2).reshape(b, -1).mean(dim=1)
    divergence = (drift / (2.0 * scale**2)).detach()  # (B,)
    high = divergence >= threshold
    drop = high & (((ratio > 1.0) & (adv > 0)) | ((ratio < 1.0) & (adv < 0)))
    per_row = torch.where(drop, torch.zeros_like(ratio), -adv * ratio)
    loss, metrics = _with_kl(_weighted(per_row, is_weights).mean(), ratio, logratio, None, kl, beta)
    with torch.no_grad():
        metrics.update({
            "loss/dppo_divergence_mean": divergence.mean(),
            "loss/dppo_divergence_max": divergence.max(),
            "loss/dppo_high_frac": high.float().mean(),
            "loss/dppo_masked_frac": drop.float().mean(),
        })
    return loss, metrics

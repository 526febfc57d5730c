"""Rollout-train consistency: how far the rollout's recorded log-prob is from the trainer's
own, and the corrections for it.

A rollout worker (bf16, other kernels, sequence-parallel) and a trainer (fp32, FSDP) do not
compute the same log-prob for the same (sample, denoising step) under the same weights.
The PPO ratio exp(logp - logp_rollout) then carries that gap: with the clip range that
step-averaged log-probs need (1e-4), a small gap clips most rows and their gradient is gone.

Names (house style): logp_rollout is what the rollout recorded, logp_train the trainer's
log-prob of the same step under the behaviour weights (detached). Their ratio

    w = pi_train / pi_rollout = exp(logp_train - logp_rollout)              (B,)

is the importance weight of veRL's rollout correction (verl/trainer/ppo/rollout_corr_helper.py,
`compute_rollout_correction_weights` for the truncated weight, `compute_rollout_rejection_mask`
for the band; read at commit 0b4e2a8, not copied):

    truncated: w_is = min(w, C)                       (TIS; veRL's default C = 2)
    mask:      w_is = 1 if 1/C <= w <= C else 0       (the row is dropped)

Both are per row (sample, step): no statistic spans rows, so how Train units cut a batch
never changes a row's term. w_is is detached: it reweights the measure, not the objective.
"""

from __future__ import annotations

import torch

from digenrl.math.kinds import BEHAVIOUR_KINDS, IS_KINDS, ROLLOUT_DTYPES


def logp_gap_metrics(logp_rollout: torch.Tensor, logp_train: torch.Tensor, clip_range: float) -> dict[str, torch.Tensor]:
    """The rollout-train gap of a set of rows, (B,) each -> scalar metrics.

    gap = logp_train - logp_rollout (the log of w above). past_clip: the share of rows whose
    ratio exp(gap) lies outside [1 - clip_range, 1 + clip_range], i.e. rows the clipped loss
    would clip on the gap alone (train.behaviour_logp=rollout). Keys ending in _max combine by
    max across units and trainers, the others by the step's weighted mean.
    """
    with torch.no_grad():
        gap = logp_train.detach().float() - logp_rollout.float()  # (B,)
        return {
            "consistency/gap_mean": gap.mean(),
            "consistency/gap_abs_mean": gap.abs().mean(),
            "consistency/gap_abs_max": gap.abs().max(),
            "consistency/past_clip": ((torch.exp(gap) - 1.0).abs() > clip_range).float().mean(),
        }


def rollout_correction(
    logp_train: torch.Tensor, logp_rollout: torch.Tensor, kind: str, band: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(w_is (B,), metrics): the per-row weight the loss multiplies, detached.

    kind: none (all ones), truncated (min(w, band)) or mask (1 inside [1/band, band], else 0);
    band > 1. See the module docstring for the formulas and their source.
    """
    if kind not in IS_KINDS:
        raise ValueError(f"is_correction {kind!r} unknown; allowed: {', '.join(IS_KINDS)}")
    if not band > 1.0:
        raise ValueError(f"is_band must be > 1, got {band}")
    with torch.no_grad():
        # clamp the exponent as veRL does (|log w| <= 20): a wild row must not overflow to inf
        w = torch.exp((logp_train.detach().float() - logp_rollout.float()).clamp(-20.0, 20.0))  # (B,)
        if kind == "none":
            w_is = torch.ones_like(w)
        elif kind == "truncated":
            w_is = w.clamp(max=band)
        else:
            w_is = ((w >= 1.0 / band) & (w <= band)).float()
        metrics = {
            "consistency/is_weight_mean": w_is.mean(),
            "consistency/is_weight_max": w_is.max(),
            "consistency/is_outside_band": ((w < 1.0 / band) | (w > band)).float().mean(),
        }
    return w_is, metrics

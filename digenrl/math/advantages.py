"""Group-relative advantages (GRPO) and the combination of several rewards."""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from digenrl.math.kinds import AGGREGATE_KINDS, STD_KINDS


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    std: str = "group",
    eps: float = 1e-4,
    clip: float = 5.0,
) -> torch.Tensor:
    """A = (r - mean_group) / (std + eps), clipped to +-clip; (B,) float32.

    std: "group" (std of the sample's group), "global" (std of the whole batch) or "none"
    (Dr.GRPO: no division). Standard deviations are population ones (ddof=0).
    """
    if std not in STD_KINDS:
        raise ValueError(f"advantage std {std!r} unknown; allowed: {', '.join(STD_KINDS)}")
    r = rewards.detach().float().reshape(-1)
    g = torch.as_tensor(group_ids).reshape(-1)
    if r.shape != g.shape:
        raise ValueError(f"rewards {tuple(r.shape)} and group_ids {tuple(g.shape)} must match")
    _, inverse = torch.unique(g, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    count = torch.zeros(n_groups).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros(n_groups).index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    if std == "group":
        var = torch.zeros(n_groups).index_add_(0, inverse, centred**2) / count
        adv = centred / (var.sqrt()[inverse] + eps)
    elif std == "global":
        adv = centred / (r.std(unbiased=False) + eps)
    else:
        adv = centred
    return adv.clamp(-clip, clip)


def combine_rewards(
    rewards: Mapping[str, torch.Tensor],
    weights: Mapping[str, float],
    *,
    aggregate: str = "sum",
    group_ids: Optional[torch.Tensor] = None,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Several rewards -> one (B,) reward.

    sum:  sum_k w_k r_k.
    gdpo: sum_k w_k (r_k - mean_group(r_k)) / (std_group(r_k) + eps), each reward standardised
          within its prompt group before the weighted sum (GDPO, Liu et al. 2026, arXiv
          2601.05242: otherwise distinct reward combinations collapse into one advantage, and
          a reward's scale decides its influence). Needs group_ids. GDPO's last step, one
          normalisation of this sum over the batch, is the advantage's `reward.adv_std=global`
          (group_advantages): re-standardising per group would collapse it again.
    """
    if aggregate not in AGGREGATE_KINDS:
        raise ValueError(f"reward aggregate {aggregate!r} unknown; allowed: {', '.join(AGGREGATE_KINDS)}")
    missing = set(weights) - set(rewards)
    if missing:
        raise ValueError(f"weights name rewards that were not computed: {sorted(missing)}")
    if aggregate == "gdpo" and group_ids is None:
        raise ValueError("reward aggregate 'gdpo' needs group_ids")
    total = None
    for name, w in weights.items():
        r = rewards[name].float()  # (B,)
        if aggregate == "gdpo":
            r = group_advantages(r, group_ids, std="group", eps=eps, clip=float("inf"))
        total = w * r if total is None else total + w * r
    if total is None:
        raise ValueError("no reward weights given")
    return total

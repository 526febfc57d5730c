"""Group-relative advantages (GRPO) and the combination of several rewards."""

from __future__ import annotations

from typing import Mapping, Optional

import torch

STD_KINDS = ("group", "global", "none")
COMBINE_KINDS = ("weighted", "normalized")


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
    mode: str = "weighted",
    group_ids: Optional[torch.Tensor] = None,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Several rewards -> one (B,) reward.

    weighted:   sum_k w_k r_k.
    normalized: sum_k w_k (r_k - mean_group) / (std_group + eps): each reward's scale no
                longer decides its influence (needs group_ids).
    """
    if mode not in COMBINE_KINDS:
        raise ValueError(f"reward combine mode {mode!r} unknown; allowed: {', '.join(COMBINE_KINDS)}")
    missing = set(weights) - set(rewards)
    if missing:
        raise ValueError(f"weights name rewards that were not computed: {sorted(missing)}")
    total = None
    for name, w in weights.items():
        r = rewards[name].float()
        if mode == "normalized":
            if group_ids is None:
                raise ValueError("reward combine mode 'normalized' needs group_ids")
            r = group_advantages(r, group_ids, std="group", eps=eps, clip=float("inf"))
        total = w * r if total is None else total + w * r
    if total is None:
        raise ValueError("no reward weights given")
    return total

"""Online Diffusion-DPO (Wallace et al. 2023, arXiv 2311.12908) on pairs drawn from each
prompt group: the pairing and the loss, both pure."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from digenrl.math.kinds import DPO_PAIRS


def dpo_pairs(advantages: torch.Tensor, group_ids: Sequence[int], how: str, margin: float = 0.0) -> list[tuple[int, int]]:
    """(winner, loser) row pairs drawn within each prompt group, in row order of the winner.

    best-worst: the group's highest and lowest advantage (flow_grpo's stat_tracking.py
    type 'dpo', veRL-Omni's DPOLoss.build_online_dpo_pair_indices); a group whose best and
    worst tie holds no preference and gives no pair (both peers pair two rows anyway).
    margin: every (i, j) with A_i - A_j > margin. Advantages, not rewards, are what reach a
    Train unit; within a group they order the samples as the rewards do (reward.aggregate=sum:
    A = (r - mean) / std with std > 0), so the margin is in advantage units (reward units
    under reward.adv_std=none). Ties between equal advantages go to the lower row index.
    """
    if how not in DPO_PAIRS:
        raise ValueError(f"dpo pairs {how!r} unknown; allowed: {', '.join(DPO_PAIRS)}")
    adv = [float(a) for a in advantages.detach().cpu().flatten()]
    if len(adv) != len(group_ids):
        raise ValueError(f"{len(adv)} advantages for {len(group_ids)} group ids")
    groups: dict[int, list[int]] = {}
    for row, g in enumerate(group_ids):
        groups.setdefault(int(g), []).append(row)
    pairs: list[tuple[int, int]] = []
    for rows in groups.values():
        if how == "best-worst":
            best = max(rows, key=lambda r: (adv[r], -r))
            worst = min(rows, key=lambda r: (adv[r], r))
            if adv[best] > adv[worst]:
                pairs.append((best, worst))
        else:
            pairs += [(i, j) for i in rows for j in rows if adv[i] - adv[j] > margin]
    return sorted(pairs)


def flow_matching_error(v: torch.Tensor, x_t: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """mean((v - u)^2) per row, (B,): u = eps - x0 = (x_t - x0) / sigma is the rectified-flow
    velocity target of x_t = (1 - sigma) x0 + sigma eps (sigma > 0; digenrl.math.sde)."""
    b = v.shape[0]
    s = sigma.float().reshape(b, *([1] * (v.ndim - 1)))
    u = (x_t.detach().float() - x0.detach().float()) / s
    return ((v.float() - u) ** 2).reshape(b, -1).mean(dim=1)


def dpo_loss(
    err: torch.Tensor, err_ref: torch.Tensor, *, beta: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Diffusion-DPO on P pairs: rows [0, P) are the winners, [P, 2P) their losers, pair i
    noised with one eps and one sigma (arXiv 2311.12908 Eq. 14; its loss is Eq. 14's with
    the error mean over elements and the beta T omega(lambda_t) factor written beta / 2, as
    the peers write it: yifan123/flow_grpo@ac4c86e scripts/train_sd3_dpo.py:926-937, veRL-Omni
    DPOLoss.compute_loss, diffusers' examples/research_projects/diffusion_dpo):

        d_w  = err_w - err_ref_w          d_l = err_l - err_ref_l        (B = 2P,) -> (P,)
        z    = -beta / 2 (d_w - d_l)      (the implicit reward margin)
        loss = mean_P( -log sigmoid(z) )

    err, err_ref: (2P,) per-row flow-matching errors of the policy and of the reference
    (`flow_matching_error`); err_ref is detached. The gradient in err_w is
    sigmoid(-z) beta / (2P), in err_l its negative: the winner's error is pushed down and the
    loser's up, each by how wrongly the pair is ranked (sigmoid(-z) -> 0 once z >> 0).
    """
    p = err.shape[0] // 2
    if err.shape[0] != 2 * p or err_ref.shape != err.shape or p == 0:
        raise ValueError(f"dpo_loss takes 2P rows of winners then losers, got {tuple(err.shape)}, {tuple(err_ref.shape)}")
    diff = err - err_ref.detach().float()  # (2P,)
    d_w, d_l = diff[:p], diff[p:]
    z = -0.5 * beta * (d_w - d_l)  # (P,)
    loss = -F.logsigmoid(z).mean()
    with torch.no_grad():
        metrics = {
            "loss/policy": loss.detach(),
            "loss/dpo_implicit_acc": (z > 0).float().mean(),
            "loss/dpo_implicit_margin": z.mean(),
            "loss/dpo_err_winner": err[:p].detach().mean(),
            "loss/dpo_err_loser": err[p:].detach().mean(),
        }
    return loss, metrics

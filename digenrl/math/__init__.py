"""Pure-torch math of Flow-GRPO and its relatives (no Ray, no diffusers).

The rectified-flow convention is in `digenrl.math.sde`; the README's "The algorithm" is the
overview. All SDE math runs in float32 whatever the model dtype (bf16 log-probs drift).
"""

from digenrl.math.advantages import combine_rewards, group_advantages
from digenrl.math.consistency import BEHAVIOUR_KINDS, IS_KINDS, logp_gap_metrics, rollout_correction
from digenrl.math.loss import (LOSS_KINDS, gaussian_mean_kl, grpo_guard_loss, grpo_loss, nft_loss, nft_old_decay,
                               nft_optimality)
from digenrl.math.loss import AWM_WEIGHTINGS, CLEAN_SAMPLE_LOSSES, awm_log_likelihood, awm_loss  # AWM (issue 27)
from digenrl.math.schedule import SdeWindow, sigma_schedule
from digenrl.math.sde import SDE_KINDS, StepOut, sde_step

__all__ = [
    "AWM_WEIGHTINGS",
    "CLEAN_SAMPLE_LOSSES",
    "awm_log_likelihood",
    "awm_loss",
    "BEHAVIOUR_KINDS",
    "IS_KINDS",
    "logp_gap_metrics",
    "rollout_correction",
    "LOSS_KINDS",
    "SDE_KINDS",
    "SdeWindow",
    "StepOut",
    "combine_rewards",
    "gaussian_mean_kl",
    "group_advantages",
    "grpo_guard_loss",
    "grpo_loss",
    "nft_loss",
    "nft_old_decay",
    "nft_optimality",
    "sde_step",
    "sigma_schedule",
]

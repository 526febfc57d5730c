"""Pure-torch math of Flow-GRPO and its relatives (no Ray, no diffusers).

The rectified-flow convention is in `digenrl.math.sde`; the README's "The algorithm" is the
overview. All SDE math runs in float32 whatever the model dtype (bf16 log-probs drift).
"""

from digenrl.math.advantages import combine_rewards, group_advantages
from digenrl.math.consistency import BEHAVIOUR_KINDS, IS_KINDS, logp_gap_metrics, rollout_correction
from digenrl.math.dpo import DPO_PAIRS, dpo_loss, dpo_pairs, flow_matching_error
from digenrl.math.loss import (AWM_WEIGHTINGS, CLEAN_SAMPLE_LOSSES, LOSS_KINDS, awm_log_likelihood, awm_loss,
                               flow_dppo_loss, gaussian_mean_kl, grpo_guard_loss, grpo_loss, nft_loss, nft_old_decay,
                               nft_optimality)
from digenrl.math.schedule import SdeWindow, sigma_schedule
from digenrl.math.sde import SDE_KINDS, StepOut, sde_step

__all__ = [
    "AWM_WEIGHTINGS",
    "CLEAN_SAMPLE_LOSSES",
    "DPO_PAIRS",
    "awm_log_likelihood",
    "awm_loss",
    "dpo_loss",
    "dpo_pairs",
    "flow_dppo_loss",
    "flow_matching_error",
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

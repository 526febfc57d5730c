"""Pure-torch math of Flow-GRPO and its relatives (no Ray, no diffusers).

The rectified-flow convention is in `digenrl.math.sde`; the README's "The algorithm" is the
overview. All SDE math runs in float32 whatever the model dtype (bf16 log-probs drift).
"""

from digenrl.math.lazy import lazy_names

# Loaded on first use (PEP 562), so that `digenrl.math.kinds` and `digenrl.math.window`, which
# the configuration and the simulator read, come without torch.
_WHERE = {
    "combine_rewards": "advantages", "group_advantages": "advantages",
    "BEHAVIOUR_KINDS": "kinds", "IS_KINDS": "kinds", "logp_gap_metrics": "consistency",
    "rollout_correction": "consistency",
    "DPO_PAIRS": "kinds", "dpo_loss": "dpo", "dpo_pairs": "dpo", "flow_matching_error": "dpo",
    "AWM_WEIGHTINGS": "kinds", "CLEAN_SAMPLE_LOSSES": "kinds", "LOSS_KINDS": "kinds",
    "awm_log_likelihood": "loss", "awm_loss": "loss", "flow_dppo_loss": "loss", "gaussian_mean_kl": "loss",
    "grpo_guard_loss": "loss", "grpo_loss": "loss", "nft_loss": "loss", "nft_old_decay": "loss",
    "nft_optimality": "loss",
    "SdeWindow": "window", "sigma_schedule": "schedule",
    "SDE_KINDS": "kinds", "StepOut": "sde", "sde_step": "sde",
}
__all__ = sorted(_WHERE)
__getattr__ = lazy_names(__name__, _WHERE)

"""Pure-torch math of Flow-GRPO and its relatives (no Ray, no diffusers).

The rectified-flow convention is in `digenrl.math.sde`; the README's "The algorithm" is the
overview. All SDE math runs in float32 whatever the model dtype (bf16 log-probs drift).
"""

import importlib

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


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:  # a submodule (`from digenrl.math import rng`): the import system loads it
        raise AttributeError(f"module 'digenrl.math' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"digenrl.math.{where}"), name)
    globals()[name] = value
    return value


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

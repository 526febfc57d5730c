"""The math layer's vocabularies and sizes, without torch.

The configuration checks these names and the simulator reads these sizes; neither runs a
tensor, so neither should pay for importing torch (about 1.8 s, in every process that unpickles
a planner's duration function). The modules that implement each choice import its names from
here.
"""

from __future__ import annotations

# advantages.py
STD_KINDS = ("group", "global", "none")
AGGREGATE_KINDS = ("sum", "gdpo")
# consistency.py
BEHAVIOUR_KINDS = ("rollout", "recompute")
IS_KINDS = ("none", "truncated", "mask")
ROLLOUT_DTYPES = ("", "bfloat16")  # sampling.rollout_dtype: "" = the model's own dtype
# dpo.py
DPO_PAIRS = ("best-worst", "margin")
# loss.py
LOSS_KINDS = ("grpo", "grpo-guard", "nft", "dpo", "flow-dppo", "awm")
AWM_WEIGHTINGS = ("uniform", "t", "t2", "ghuber")
# the objectives trained on forward-process targets of the clean sample, not on recorded
# log-probs: any sampler serves them, the ODE included (rollout.sampler.forward_targets)
CLEAN_SAMPLE_LOSSES = ("nft", "dpo", "awm")
# sde.py
SDE_KINDS = ("flow-sde", "dance-sde", "cps", "ode")
# schedule.py
WINDOW_KINDS = ("all-but-last", "first", "contiguous", "sliding", "fraction")
WINDOW_DRAWS = ("step", "sample")  # trained steps drawn once per RL step, or per sample
# rollout/sampler.py: SampleSpec.model_timestep, sampling.model_timestep
MODEL_TIMESTEPS = ("exact", "floor")

# grad_sum.py: train.grad_sum
GRAD_SUMS = ("auto", "float64", "float32")
# auto: float64 up to 2^28 trainable parameters (2 GiB of sums per rank before sharding)
AUTO_FLOAT64_PARAMS = 2**28


def grad_sum_bytes(choice: str, trainable_params: int) -> int:
    """Bytes per gradient element of the sums (and of the cross-trainer all-reduce) that
    `train.grad_sum` names; auto decides by the trainable parameter count."""
    if choice not in GRAD_SUMS:
        raise ValueError(f"train.grad_sum={choice!r} unknown; allowed: {', '.join(GRAD_SUMS)}")
    if choice == "auto":
        return 8 if trainable_params <= AUTO_FLOAT64_PARAMS else 4
    return 8 if choice == "float64" else 4

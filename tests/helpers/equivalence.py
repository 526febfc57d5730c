"""One claim, one assertion: a distributed run ends at the single-device run's weights.

Every on-policy mode trains the same trajectories with the same advantages as `Trainer`
(run.mode=local), so both runs must end with the same weights up to float round-off. This
module is the one place that says how much round-off is allowed, and why.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from digenrl.models import build_policy
from digenrl.models.lora import trainable_state_dict
from digenrl.runs import run_config

# The tolerance, relative to how far training moved the weights (see the docstring below).
ROUND_OFF = 1e-2


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The trainable weights a run saved at its end (LoRA: the adapters)."""
    return load_file(str(Path(run) / "final" / "policy.safetensors"))


def start_weights(run: Path) -> dict[str, torch.Tensor]:
    """The trainable weights the run started from, rebuilt from its config.json."""
    policy = build_policy(run_config(Path(run), []).model, progress=False)
    return trainable_state_dict(policy.module)


def weight_gap(run: Path, reference: Path) -> tuple[float, float]:
    """(largest |run - reference| over every trainable weight, largest |reference - start|)."""
    a, b, start = final_weights(run), final_weights(reference), start_weights(reference)
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    diff = max(float((a[k] - b[k]).abs().max()) for k in b)
    change = max(float((b[k] - start[k]).abs().max()) for k in b)
    return diff, change


def assert_matches_single_device(run: Path, reference: Path) -> None:
    """`run` ends where the single-device `reference` does.

    The rule: no trainable weight of `run` differs from `reference`'s by more than
    ROUND_OFF = 1% of the largest change training made to any weight of `reference` (and the
    reference must have trained: that change is above 1e-4).

    Why this much. Gradients are summed over units and across trainers in float64
    (train.grad_sum, digenrl.math.grad_sum), so which worker ran which unit, and in what order
    they finished, does not reach the weights: every mode whose forward and backward passes
    see the same rows as the reference's ends bitwise equal to it (TSP, TAG, TCSS-free
    on-policy modes, faults, drains, lost nodes; measured 0.0 on 2026-12-01). What is left is
    float32 round-off inside a pass whose rows differ from the reference's: micro-batches that
    cut prompt groups or sample shards (other batch sizes in generation and backward; up to
    0.43% of the change, DiffusionNFT, whose loss reads the final sample), sequence-parallel
    attention (0.29%), and FSDP gangs, whose ranks backward their share of the rows and
    reduce-scatter in float32 (0.75% for a full fine-tune). AdamW turns a gradient into a
    step of at most about `lr` per weight, so that round-off scales with the distance
    training moved the weights, not with their size; hence a bound relative to the change.
    A run that trained a unit twice, skipped one, or used another version's trajectory is off
    by the size of a step, ~lr: around 50% of a two-step run's change, 50x this bound.
    """
    diff, change = weight_gap(run, reference)
    assert change > 1e-4, f"the reference run did not train (largest weight change {change:.3g})"
    assert diff <= ROUND_OFF * change, (
        f"{run} ends {diff:.3g} away from the single-device run; the bound is "
        f"{ROUND_OFF:g} x its largest weight change {change:.3g} = {ROUND_OFF * change:.3g}")

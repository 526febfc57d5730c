"""One claim, one assertion: a distributed run ends at the single-device run's weights.

Every on-policy mode trains the same trajectories with the same advantages as `Trainer`
(run.mode=local), so both runs must end with the same weights up to float round-off. This
module is the one place that says how much round-off is allowed, and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from digenrl.config.schema import load_config
from digenrl.models import build_policy
from digenrl.models.lora import trainable_state_dict
from digenrl.io.runs import run_config

# The tolerance, relative to how far training moved the weights (see the docstring below):
# the run's passes batch the reference's rows / they batch other rows.
SAME_ROWS, OTHER_ROWS = 1e-4, 1e-2


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


def _configs(run: Path) -> list:
    """Every config `run` ran under: config.json, and each checkpoint's (a resumed run may have
    changed, e.g. its gang size)."""
    run = Path(run)
    trees = [json.loads((run / "config.json").read_text())]
    trees += [json.loads(p.read_text()).get("config") for p in sorted(run.glob("checkpoints/step_*/state.json"))]
    return [load_config(None, [], tree=t) for t in trees if t]


def rows_batched_otherwise(run: Path) -> list[str]:
    """The config keys under which some forward or backward pass of `run` held other rows than
    the single-device run's passes (each a reason for round-off beyond the sum's order)."""
    found: dict[str, bool] = {}
    for cfg in _configs(run):
        rt = cfg.runtime
        for key, on in {
            "data.micro_batch_samples": cfg.data.micro_batch_samples > 0,  # micro-batches cut prompt groups
            "runtime.gen_shard": rt.gen_shard > 1,  # a micro-batch generated in sample shards
            "runtime.train_shard": rt.train_shard > 1,  # ... trained in sample shards
            "runtime.trainer.gang": rt.trainer.gang > 1,  # FSDP: each rank backwards its share of the rows
            "runtime.trainer.sp": rt.trainer.sp > 1,  # sequence-parallel attention: other partial sums
            "runtime.rollout.gang": rt.rollout.gang > 1,
        }.items():
            found[key] = found.get(key, False) or on
    return [key for key, on in found.items() if on]


def assert_matches_single_device(run: Path, reference: Path) -> None:
    """`run` ends where the single-device `reference` does.

    The rule: no trainable weight of `run` differs from `reference`'s by more than a fraction
    of the largest change training made to any weight of `reference` (which must have trained:
    that change is above 1e-4). The fraction is SAME_ROWS = 0.01% when every forward and
    backward pass of `run` holds the rows the reference's pass holds, and OTHER_ROWS = 1% when
    `run` batches rows otherwise (`rows_batched_otherwise`: sample shards, micro-batches that
    cut groups, FSDP gangs, sequence parallelism).

    Why. Gradients are summed over units and across trainers in float64 (train.grad_sum,
    digenrl.math.grad_sum), so which worker ran which unit, and in what order they finished,
    does not reach the weights: with the same rows per pass, TSP, TAG, faults, drains and lost
    nodes all ended bitwise equal to the reference (measured 2026-12-01); SAME_ROWS leaves room
    only for the rare element whose float64 sum rounds to the other side of a float32 boundary.
    A pass over other rows has other float32 round-off inside its kernels: measured up to 0.43%
    of the change with micro-batches that cut prompt groups (DiffusionNFT, whose loss reads the
    final sample), 0.29% with sequence-parallel attention, 0.75% for a full fine-tune on FSDP
    gangs. AdamW turns a gradient into a step of at most about `lr` per weight, so round-off in
    the weights scales with the distance training moved them, not with their size; hence a
    bound relative to the change. A run that trained a unit twice, skipped one, or used
    another version's trajectory is off by the size of a step, ~lr: around 50% of a two-step
    run's change, 50x the looser bound.
    """
    diff, change = weight_gap(run, reference)
    assert change > 1e-4, f"the reference run did not train (largest weight change {change:.3g})"
    otherwise = rows_batched_otherwise(run)
    fraction = OTHER_ROWS if otherwise else SAME_ROWS
    why = f"rows batched otherwise by {', '.join(otherwise)}" if otherwise else "the same rows per pass"
    assert diff <= fraction * change, (
        f"{run} ends {diff:.3g} away from the single-device run; the bound ({why}) is "
        f"{fraction:g} x its largest weight change {change:.3g} = {fraction * change:.3g}")

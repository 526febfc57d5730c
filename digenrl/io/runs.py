"""A finished (or running) run directory, read back: its config and its saved weights.

    snap = resolve_snapshot(run_dir, "final")     # or "0" (the base model), "40", ...
    cfg = run_config(run_dir, ["model.path=/new/place/base.safetensors"])
    policy = load_policy(cfg, snap)               # base model + the snapshot's weights

The weights a run saves are its trainable ones (digenrl.io.checkpoint): under LoRA only the
adapters, which go onto the base built from the run's own model config; a full fine-tune
saves every weight. Both checkpoint layouts load (unsharded policy.safetensors, or the
dcp/ folder of an FSDP gang), and final/policy.safetensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from digenrl.io import checkpoint as ckpt
from digenrl.config.schema import Config, load_config

BASE = "0"  # the step label of the base model: no weights loaded


class RunError(ValueError):
    """The run directory, or the step asked of it, cannot be read."""


@dataclass(frozen=True)
class Snapshot:
    """One set of weights of a run."""

    label: str  # what the user asked for: "0", "40", "final"
    step: int  # RL steps the weights have taken (0 = the base model)
    path: Optional[Path]  # step folder (policy.safetensors or dcp/) or final/; None = the base

    @property
    def name(self) -> str:
        if self.path is None:
            return "base (step 0)"
        return f"final (step {self.step})" if self.label == "final" else f"step {self.step}"


def check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise RunError(f"--run-dir: {str(run_dir)!r} is not a directory")
    if not (run_dir / "config.json").exists():
        raise RunError(f"--run-dir: {str(run_dir)!r} has no config.json (not a digenrl run directory?)")


def snapshots(run_dir: Path) -> dict[str, Snapshot]:
    """Every set of weights in `run_dir`, by label: "0", each checkpoint's step, "final"."""
    found = {BASE: Snapshot(BASE, 0, None)}
    for d in ckpt.list_checkpoints(run_dir):
        step = int(d.name.split("_")[1])  # step_000040 -> 40
        found[str(step)] = Snapshot(str(step), step, d)
    final = Path(run_dir) / "final" / "policy.safetensors"
    if final.exists():
        from safetensors import safe_open

        with safe_open(str(final), framework="pt") as f:
            step = int((f.metadata() or {}).get("step", -1))
        found["final"] = Snapshot("final", step, final.parent)
    return found


def resolve_snapshot(run_dir: Path, step: str) -> Snapshot:
    """The weights `--step` names ("final", "0" or a checkpoint's RL step); a RunError that
    lists what there is otherwise."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    found = snapshots(run_dir)
    key = str(step).strip().lower()
    if key.isdigit():
        key = str(int(key))  # "040" -> "40"
    if key not in found:
        have = ", ".join(found)
        raise RunError(f"--step {step}: {run_dir} has no such weights; available: {have} (0 = the base model)")
    snap = found[key]
    if snap.path is not None and snap.label != "final":
        try:
            ckpt.verify_checkpoint(snap.path)
        except ckpt.CheckpointError as e:
            raise RunError(f"--step {step}: {e}") from None
    return snap


def run_config(run_dir: Path, overrides: list[str]) -> Config:
    """The run's config.json, with key=value `overrides` (e.g. model.path after a move)."""
    tree = json.loads((Path(run_dir) / "config.json").read_text())
    return load_config(None, overrides, tree=tree)


def load_policy(cfg: Config, snap: Snapshot, *, ema: bool = False, progress: bool = True):
    """The run's policy (digenrl.models.build_policy of cfg.model) with the weights of
    `snap` loaded: the policy's, or with `ema` its EMA's."""
    from digenrl.models import build_policy

    policy = build_policy(cfg.model, progress=progress)
    if snap.path is not None:
        load_snapshot(policy, snap, ema=ema)
    return policy


def load_snapshot(policy, snap: Snapshot, *, ema: bool = False) -> None:
    """Load `snap`'s weights into a policy built from the run's model config, in place."""
    if snap.path is None:
        raise ValueError("the base snapshot has no weights to load")
    try:
        ckpt.load_weights(snap.path, policy.module, ema=ema)
    except (FileNotFoundError, KeyError) as e:
        raise RunError(f"{snap.name}: {e}") from None

"""Checkpoints without pickle: safetensors for tensors, JSON for the rest.

    <run_dir>/checkpoints/step_000010/
        policy.safetensors      trainable weights (adapters only under LoRA)
        optimizer.safetensors   optimizer state tensors; param_groups in the metadata
        ema.safetensors         EMA weights, when EMA is on
        state.json              step, policy version, data cursor, config
A checkpoint is written to a temporary folder and renamed into place, so a crash while
saving never leaves a half-written "latest" checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import load_file, save_file


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            tensors[f"{pid}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
    return tensors, {"param_groups": json.dumps(sd["param_groups"])}


def load_optimizer_tensors(optimizer: torch.optim.Optimizer, path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        groups = json.loads(f.metadata()["param_groups"])
    state: dict[int, dict[str, Any]] = {}
    for key, t in load_file(str(path)).items():
        pid, name = key.split(".", 1)
        state.setdefault(int(pid), {})[name] = t
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    policy_state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    ema_state: Optional[dict[str, torch.Tensor]],
    state: dict[str, Any],
    keep: int,
) -> Path:
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in policy_state.items()}, str(tmp / "policy.safetensors"))
    tensors, meta = optimizer_tensors(optimizer)
    save_file(tensors, str(tmp / "optimizer.safetensors"), metadata=meta)
    if ema_state is not None:
        save_file({k: v.cpu().contiguous() for k, v in ema_state.items()}, str(tmp / "ema.safetensors"))
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "state.json").exists())


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None

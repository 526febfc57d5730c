"""Metric loggers beyond metrics.jsonl and TensorBoard: Weights & Biases (run.loggers=[wandb]).

    require_wandb()                 raises ConfigError naming the `digenrl[wandb]` extra
    WandbLogger(cfg)                wandb.init(project, dir=run_dir, config, mode)
        .log(record)                one metrics.jsonl record: its finite numbers, and the
                                    eval sample grid of that step (samples/step_N.png)
        .close()                    wandb.finish()

metrics.jsonl stays the record of the run; a logger mirrors it. Scalars keep the names
TensorBoard gives them (`step/reward_mean`; keys with a '/' as they are), so the two
dashboards read alike. A resumed run (`--resume`) starts a new wandb run whose history
begins after the checkpoint it resumed from.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from digenrl.config.errors import ConfigError
from digenrl.config.schema import Config

EXTRA = "digenrl[wandb]"


def require_wandb() -> None:
    """Refuse run.loggers=[wandb] before any work when the package is missing."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"run.loggers: wandb is not installed; install the extra: pip install '{EXTRA}' "
                          "(or drop wandb from run.loggers)")


def scalar_name(key: str) -> str:
    """The dashboard name of a metrics.jsonl key (the one TensorBoard uses too)."""
    return key if "/" in key else f"step/{key}"


def finite_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers but `step`, under their dashboard names."""
    return {scalar_name(k): v for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class WandbLogger:
    """Mirrors metrics.jsonl records into one wandb run (files under run_dir/wandb/)."""

    def __init__(self, cfg: Config):
        require_wandb()
        import wandb

        self.run_dir = Path(cfg.run.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self.run = wandb.init(project=cfg.run.wandb_project, dir=str(self.run_dir), config=cfg.to_dict(),
                              mode=cfg.run.wandb_mode, name=self.run_dir.name, reinit="create_new")

    def log(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        data: dict[str, Any] = finite_scalars(record)
        grid = self.run_dir / "samples" / f"step_{step:06d}.png"
        if "eval/reward_mean" in record and grid.exists():  # the Evaluator's grid of this evaluation
            data["eval/samples"] = self._wandb.Image(str(grid), caption=f"held-out samples after {step} RL steps")
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()

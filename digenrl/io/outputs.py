"""What a run leaves behind: metrics.jsonl, TensorBoard events, sample grids, plots."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from PIL import Image

# Per-step keys every metrics.jsonl line has (the README documents them).
REQUIRED_KEYS = ("step", "reward_mean", "reward_std", "loss", "clipfrac", "ratio_mean", "samples", "wall_s", "samples_per_s")
TIMING_KEYS = ("wall_s", "samples_per_s", "step_s")  # differ between otherwise identical runs


class MetricsLog:
    """Appends one JSON line per optimizer step (and eval), mirrored to TensorBoard and to
    `sinks`: more loggers, each with log(record) and close() (digenrl/io/loggers.py)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool, resume_after: Optional[int] = None,
                 sinks: Sequence[Any] = ()):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_after is not None and self.path.exists():
            # drop what was logged after the checkpoint we resume from: it is redone
            kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["step"] <= resume_after]
            self.path.write_text("".join(k + "\n" for k in kept))
        elif resume_after is None and self.path.exists():
            self.path.unlink()
        self.sinks = list(sinks)
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_after + 1 if resume_after is not None else None
            self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=purge)

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.writer is not None:
            step = int(record["step"])
            for k, v in clean.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(k if "/" in k else f"step/{k}", v, step)
        for sink in self.sinks:
            sink.log(clean)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(l) for l in path.read_text().splitlines() if l] if path.exists() else []


def save_grid(images: torch.Tensor, path: Path, nrow: int, scale: int = 4) -> None:
    """(B, 3, H, W) in [0, 1] -> one PNG, `nrow` images per row, upscaled `scale`x."""
    b, c, h, w = images.shape
    ncol = math.ceil(b / nrow)
    canvas = torch.ones(3, ncol * (h + 1), nrow * (w + 1))
    for i in range(b):
        r, q = divmod(i, nrow)
        canvas[:, r * (h + 1) : r * (h + 1) + h, q * (w + 1) : q * (w + 1) + w] = images[i].float().clamp(0, 1)
    arr = (canvas.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    img = Image.fromarray(arr)
    img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def plot_rewards(run_dir: Path, out: Optional[Path] = None) -> Path:
    """Train reward per step and held-out eval reward over steps, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    train = [(r["step"], r["reward_mean"]) for r in records if "reward_mean" in r]
    evals = [(r["step"], r["eval/reward_mean"]) for r in records if "eval/reward_mean" in r]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    if train:
        ax.plot(*zip(*train), label="train reward (rollout)", color="tab:blue", alpha=0.7)
    if evals:
        ax.plot(*zip(*evals), "o-", label="held-out eval reward (ODE)", color="tab:red")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out = out or Path(run_dir) / "reward_curve.png"
    fig.savefig(out)
    plt.close(fig)
    return out

"""One run recorder for the single-device Trainer and the Ray RayDriver.

Both trainers leave the same things behind and keep the same rhythm; this class owns it:

    resume_checkpoint()   latest checkpoint under run_dir (or a warning: start from scratch)
    open(resumed_from)    run_dir, config.json, metrics.jsonl (cut back to the resumed step),
                          progress bar over RL steps (on a terminal only, see below)
    eval_due(step)        held-out evaluation after RL step `step`?
    checkpoint_due(step)  checkpoint after RL step `step`?
    log(record)           one metrics.jsonl line; step records also move the bar and print
                          the per-step line
    finish(...)           final/policy.safetensors (+ ema), reward_curve.png, summary.json
    close()

Console: one `step_line` per RL step on stdout. The tqdm bar (on stderr) is drawn only when
both streams are terminals: in a file its carriage-return frames would interleave with the
step lines (`digenrl train > log 2>&1`), so a log holds the step lines alone.

`step` is always the number of RL steps done (== policy version): step 0 is the base
model, step k the weights after k optimizer steps. The recorder never touches models or
Ray: the trainers compute, it records (so `runtime/` stays the only Ray importer).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional, TextIO

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from digenrl.io import checkpoint as ckpt
from digenrl.config.schema import Config
from digenrl.io.outputs import MetricsLog, plot_rewards, read_metrics

log = logging.getLogger(__name__)

# Keys every summary.json has, local and Ray alike (RayDriver adds its own `extra` keys).
SUMMARY_KEYS = ("steps", "mode", "eval_reward_before", "eval_reward_after", "wall_s", "samples_per_s", "run_dir",
                "final_policy", "reward_plot")


class RunRecorder:
    """What a training run writes and when, shared by `Trainer` and `RayDriver`.

    `progress=False` silences the bar and the per-step lines (files are written either way).
    `out`, `err`: where the step lines and the bar go (default: sys.stdout, sys.stderr at open()).
    `checkpoints=False`: no checkpoint at all (a probe run of runtime.plan).
    """

    def __init__(self, cfg: Config, *, progress: bool = True, out: Optional[TextIO] = None,
                 err: Optional[TextIO] = None, checkpoints: bool = True):
        self.cfg = cfg
        self.checkpoints = checkpoints  # False (runtime.plan's probe runs): checkpoint_due is never true
        self.run_dir = Path(cfg.run.run_dir)
        self.progress = progress
        self.start = 0  # RL step the run starts from (the resumed step, else 0)
        self._streams = (out, err)
        self._out: Optional[TextIO] = None
        self._metrics: Optional[MetricsLog] = None
        self._bar: Optional[tqdm] = None  # only on a terminal

    # -- resume and open --------------------------------------------------------------------
    def resume_checkpoint(self) -> Optional[Path]:
        """The latest checkpoint to resume from; None (with a warning) when there is none."""
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            log.warning("--resume: no checkpoint under %s; starting from scratch", self.run_dir)
        return latest

    def open(self, resumed_from: Optional[int]) -> None:
        """Start recording: config.json, metrics.jsonl and the progress bar.

        `resumed_from`: the step of the checkpoint the run continues from (its later
        metrics lines are dropped: they are redone), or None for a fresh run (the old
        metrics.jsonl, if any, is removed).
        """
        cfg = self.cfg
        self.start = resumed_from or 0
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
        sinks = []
        if "wandb" in cfg.run.loggers:
            from digenrl.io.loggers import WandbLogger

            sinks.append(WandbLogger(cfg))
        self._metrics = MetricsLog(self.run_dir, tensorboard="tensorboard" in cfg.run.loggers,
                                   resume_after=resumed_from, sinks=sinks)
        out, err = self._streams
        self._out, err = out or sys.stdout, err or sys.stderr
        if self.progress and _is_terminal(self._out) and _is_terminal(err):
            self._bar = tqdm(desc=f"GRPO [{cfg.run.mode}]", initial=self.start, total=cfg.train.steps,
                             unit="step", file=err)

    # -- cadence ----------------------------------------------------------------------------
    def eval_due(self, step: int) -> bool:
        """Evaluate the weights after RL step `step`?

        The starting weights only on a fresh run (a resumed run logged its evaluations up
        to the checkpoint); then every run.eval_every steps, and always after the last step.
        """
        if step <= self.start:  # weights this run starts from (or steps before them)
            return step == self.start == 0
        every = self.cfg.run.eval_every
        return step == self.cfg.train.steps or bool(every and step % every == 0)

    def checkpoint_due(self, step: int) -> bool:
        """Checkpoint after RL step `step`? Every run.checkpoint_every steps and after the
        last step; never before the first step of this run (that state is on disk already,
        or is the base model)."""
        if step <= self.start or not self.checkpoints:
            return False
        every = self.cfg.run.checkpoint_every
        return step == self.cfg.train.steps or bool(every and step % every == 0)

    # -- per-step records -------------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        """Append `record` to metrics.jsonl. An RL step record (one with `reward_mean`; the
        step-0 evaluation has none) also prints one line and moves the bar (if any) to its step."""
        if self._metrics is None:
            raise RuntimeError("RunRecorder.log before open(): nothing to write to")
        self._metrics.log(record)
        if "reward_mean" not in record or not self.progress:
            return
        if self._bar is None:
            print(step_line(record), file=self._out, flush=True)
            return
        self._bar.update(record["step"] - self._bar.n)
        self._bar.set_postfix(reward=f"{record['reward_mean']:.3f}")
        tqdm.write(step_line(record), file=self._out)  # above the bar, not through it

    def close(self) -> None:
        """Flush and close metrics and the bar (idempotent; finish() works after it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    # -- the end of the run -----------------------------------------------------------------
    def finish(self, policy_state: dict[str, torch.Tensor], ema_state: Optional[dict[str, torch.Tensor]], *,
               steps: int, wall_s: float, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        """Write the final weights, the reward plot and summary.json; return the summary.

        `policy_state`: trainable weights (adapters only under LoRA); `ema_state`: EMA
        weights or None; both saved with metadata {config, step}. `steps`: RL steps the
        final weights have taken; `wall_s`: seconds spent in RL steps, over resumes.
        `extra`: more summary keys (the Ray runtime's scheduler stats, trace, gantt); they
        may not replace the common SUMMARY_KEYS.

        `samples_per_s` (achieved): the samples of every RL-step record in metrics.jsonl over
        `wall_s`. With `predicted_samples_per_s` in `extra` (runtime.plan's simulated rate) the
        summary also has `achieved_over_predicted`, their ratio (`rate_line` prints both).
        """
        extra = extra or {}
        clash = sorted(set(extra) & set(SUMMARY_KEYS))
        if clash:
            raise ValueError(f"summary extra keys {clash} would replace common keys; common keys are {SUMMARY_KEYS}")
        final = self.run_dir / "final"
        final.mkdir(parents=True, exist_ok=True)
        meta = {"config": json.dumps(self.cfg.to_dict()), "step": str(steps)}
        save_file(_cpu(policy_state), str(final / "policy.safetensors"), metadata=meta)
        if ema_state is not None:
            save_file(_cpu(ema_state), str(final / "ema.safetensors"), metadata=meta)
        plot = plot_rewards(self.run_dir)
        records = read_metrics(self.run_dir)
        evals = [r for r in records if "eval/reward_mean" in r]
        samples = sum(r["samples"] for r in records if "reward_mean" in r)  # RL-step records only
        achieved = samples / wall_s if wall_s > 0 else None
        summary = {
            "steps": steps,
            "mode": self.cfg.run.mode,
            "eval_reward_before": evals[0]["eval/reward_mean"] if evals else None,
            "eval_reward_after": evals[-1]["eval/reward_mean"] if evals else None,
            "wall_s": wall_s,
            "samples_per_s": achieved,
            "run_dir": str(self.run_dir),
            "final_policy": str(final / "policy.safetensors"),
            "reward_plot": str(plot),
            **extra,
        }
        predicted = extra.get("predicted_samples_per_s")
        if predicted and achieved is not None:
            summary["achieved_over_predicted"] = achieved / predicted
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary


def rate_line(summary: dict[str, Any]) -> Optional[str]:
    """The summary's samples/s line: achieved, and beside it the rate runtime.plan predicted
    for this run (a steady-state rate: pipeline fill and drain left out) and their ratio.
    None when the summary has no achieved rate (no RL step ran)."""
    achieved = summary.get("samples_per_s")
    if achieved is None:
        return None
    predicted = summary.get("predicted_samples_per_s")
    if not predicted:
        return f"samples/s: {achieved:.1f} achieved (RL-step samples / RL-step wall time)"
    return (f"samples/s: {achieved:.1f} achieved (RL-step samples / RL-step wall time), {predicted:.1f} predicted "
            f"by runtime.plan: achieved/predicted {achieved / predicted:.2f}")


def step_line(record: dict[str, Any]) -> str:
    """The console line of one RL step record, the same for every run.mode.

    Always step, reward mean +- std, loss, samples/s; then, when the record has them,
    staleness (Ray), rollout/trainer bubble ratios (Ray) and the held-out eval reward.
    """
    line = (f"step {record['step']:4d}  reward {record['reward_mean']:.4f} +- {record['reward_std']:.4f}  "
            f"loss {record['loss']:+.2e}  {record['samples_per_s']:.1f} samples/s")
    if "staleness_max" in record:
        line += f"  staleness {record['staleness_max']}"
    if "bubble_ratio_rollout" in record and "bubble_ratio_trainer" in record:
        line += f"  bubble r/t {record['bubble_ratio_rollout']:.2f}/{record['bubble_ratio_trainer']:.2f}"
    if "eval/reward_mean" in record:
        line += f"  eval {record['eval/reward_mean']:.4f}"
    return line


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors wants contiguous tensors; a copy off the device leaves the live ones alone
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}

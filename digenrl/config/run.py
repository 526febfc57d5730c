"""config.run: the run's mode, seed, folder, cadences and loggers (RunConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from digenrl.config.errors import check, one_of
from digenrl.sched import GAP_MODES
from digenrl.sched import MODES as SCHED_MODES

MODES = ("local", *SCHED_MODES)  # local: the single-device Trainer, no scheduler
LOGGERS = ("tensorboard", "wandb")  # run.loggers: where step metrics go besides metrics.jsonl
WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class RunConfig:
    """The run: its mode, seed, folder, evaluation and checkpoint cadence, loggers."""

    # every random draw (prompts, initial noise, SDE noise) is a function of (seed, RL step, group,
    # sample, denoising step), never of which worker ran it
    seed: int = 0
    run_dir: str = "runs/default"  # where checkpoints, metrics, config.json, traces and samples go
    # local: the single-device trainer, no Ray; every other mode runs on Ray with the scheduler
    # (docs/guides/running.md "Modes", docs/design/mechanisms.md)
    mode: str = "digenrl"
    # TCSS, the opt-in bounded staleness of the RFC: while the trainers finish a step, rollout
    # may start the next step's micro-batches with the previous weights, at most this fraction
    # of them (rounded up; the RFC's curve offers 0.5); every trajectory keeps one version, at
    # most one behind. 0 = off: strict on-policy step boundaries. GAP modes only.
    tcss_fraction: float = 0.0
    eval_every: int = 10  # held-out evaluation every this many RL steps (0 = only before and after)
    checkpoint_every: int = 10  # a checkpoint every this many RL steps (0 = only at the end)
    keep_checkpoints: int = 2  # the newest this many checkpoints are kept; older ones are deleted
    # torch intra-op threads of the run.mode=local process; 0 = torch's default. Ray modes
    # refuse it: each worker process takes runtime.worker_threads instead.
    threads: int = 0
    # where step metrics go besides metrics.jsonl: any of LOGGERS (digenrl/io/outputs.py,
    # digenrl/io/loggers.py); [] = metrics.jsonl only
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    # the older switch, kept for configs that set it: false drops tensorboard from
    # run.loggers, true requires it there; folded into run.loggers at construction (-> None)
    tensorboard: Optional[bool] = None
    wandb_project: str = "digenrl"  # wandb only: the project the run is logged under
    # wandb only: online | offline | disabled; None = wandb's own choice ($WANDB_MODE, else online)
    wandb_mode: Optional[str] = None

    def __post_init__(self) -> None:
        one_of(self.mode, "run.mode", MODES)
        check(0.0 <= self.tcss_fraction <= 1.0, "run.tcss_fraction",
              "must be in [0, 1] (0 = TCSS off, 0.5 = the RFC's setting, 1 = any micro-batch may start stale)")
        check(self.tcss_fraction == 0 or self.mode in GAP_MODES, "run.tcss_fraction",
              f"bounds staleness in the streaming modes ({', '.join(GAP_MODES)}); run.mode={self.mode} "
              "has no TCSS (one-step-off is the batch-level lag)")
        self._fold_loggers()
        check(self.eval_every >= 0, "run.eval_every", "must be >= 0 (0 = only before and after)")
        check(self.checkpoint_every >= 0, "run.checkpoint_every", "must be >= 0 (0 = only at the end)")
        check(self.keep_checkpoints >= 1, "run.keep_checkpoints", "must be >= 1")
        check(self.threads >= 0, "run.threads", "must be >= 0 (0 = torch's default)")
        check(self.threads == 0 or self.mode == "local", "run.threads",
              f"sets the threads of the run.mode=local process only; with run.mode={self.mode} every "
              "Ray worker takes runtime.worker_threads: use that (and leave run.threads at 0)")

    def _fold_loggers(self) -> None:
        """Check run.loggers and fold the run.tensorboard alias into it."""
        for name in self.loggers:
            one_of(name, "run.loggers", LOGGERS)
        check(len(set(self.loggers)) == len(self.loggers), "run.loggers", f"names a logger twice: {self.loggers}")
        if self.tensorboard is False:
            self.loggers = [name for name in self.loggers if name != "tensorboard"]
        elif self.tensorboard is True:
            check("tensorboard" in self.loggers, "run.tensorboard",
                  f"true contradicts run.loggers={self.loggers}; set run.loggers alone (run.tensorboard is "
                  "its older alias)")
        self.tensorboard = None
        if "wandb" not in self.loggers:
            check(self.wandb_project == "digenrl", "run.wandb_project",
                  "names the wandb project, but run.loggers has no wandb: add it, or leave the key unset")
            check(self.wandb_mode is None, "run.wandb_mode",
                  "sets wandb's mode, but run.loggers has no wandb: add it, or leave the key unset")
        if self.wandb_mode is not None:
            one_of(self.wandb_mode, "run.wandb_mode", WANDB_MODES)
        check(bool(self.wandb_project), "run.wandb_project", "must not be empty")


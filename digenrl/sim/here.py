"""Plan the run at hand: costs measured on this machine, the planner's search, the Config's knobs.

    digenrl.profile.profile_run(cfg) --calibration lines--> MeasuredCosts (linear in batch)
    MeasuredDurations(costs, contract)   duration_fn(worker, unit) -> seconds, as DurationFn
    plan_here(cfg, lines)                every pool split x micro-batch x TSP chunk, each
                                         simulated on the virtual clock with the real
                                         scheduler; the best as config overrides

`runtime.plan=auto` (the default) runs this before a Ray run and plans the knobs the user
did not set. The knobs it moves change no learning result: micro-batches are whole prompt
groups (advantages are per group), gradients accumulate over the step, and the pool split
only says where units run (tests/runtime/test_equivalence.py).

Shared cores. On a CPU machine the workers share `cores`: when more worker threads than
cores are busy, each runs slower. The simulator has no such coupling, so every duration is
scaled by max(1, workers * threads / cores), the slowdown when all are busy (an upper
bound: an idle worker frees its share). It is the same factor for every split of the same
worker count, so it changes the predicted rate, not which split wins.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterable, Optional

from digenrl.config.schema import Config, dotted_get, with_overrides
from digenrl.config.contract import RunContract, contract, trained_steps
from digenrl.sched import (BATCH_MODES, TAG_MODES, TSP_MODES, Generate, OptimizerStep, Reward, Scheduler,
                           Train, WeightSync, Worker, by_kind)
from digenrl.sched.units import n_samples
from digenrl.sim.calibration import LinearFit, fit_linear
from digenrl.sim.engine import run_virtual
from digenrl.sim.report import steady_window

PLAN_STEPS = 8  # simulated RL steps per candidate: 2 fill, 4 measured, the rest drain
# The knobs plan_here may set, as config keys; one the user gave stays as given.
KNOBS = ("runtime.rollout.workers", "runtime.trainer.workers", "data.micro_batch_groups", "train.tsp_chunk")


@dataclass(frozen=True)
class MeasuredCosts:
    """Per-unit-kind costs of one policy on this machine (seconds)."""

    forward: LinearFit  # one denoising step of a batch
    train_step: LinearFit  # forward + backward of one trained step of a batch
    reward: LinearFit  # decode + score a batch
    optimizer_s: float  # clip + AdamW (+ EMA) of the whole trainable state
    weights_s: float  # publish (serialise) or load the trainable state once
    weights_bytes: int

    @staticmethod
    def from_lines(lines: list[dict]) -> "MeasuredCosts":
        """From `digenrl.profile.profile_run` lines (calibration format, ms)."""
        def fit(*whats: str) -> LinearFit:
            pts = [(r["batch"], r["ms"] / 1e3) for r in lines if r["what"] in whats]
            if not pts:
                raise ValueError(f"profile has no {whats[0]!r} line: cannot plan this run")
            return fit_linear(pts)

        def one(what: str) -> dict:
            rows = [r for r in lines if r["what"] == what]
            if not rows:
                raise ValueError(f"profile has no {what!r} line: cannot plan this run")
            return rows[0]

        w = one("weights")
        return MeasuredCosts(fit("forward"), fit("fwd+bwd", "fwd+bwd-frozen-base"), fit("reward"),
                             one("optimizer")["ms"] / 1e3, w["ms"] / 1e3, int(w["bytes"]))


class MeasuredDurations:
    """duration_fn(worker, unit) -> seconds for a Config's contract on this machine."""

    def __init__(self, costs: MeasuredCosts, run: RunContract, slowdown: float = 1.0):
        self.c, self.run, self.k = costs, run, slowdown
        self.spg = run.sched.samples_per_group
        # trainer 0 publishes only when rollout workers pull (runtime/backend.py: publisher)
        self._publishes = any(w.role == "rollout" for w in run.workers())

    def __call__(self, worker: Worker, unit) -> float:
        return self.k * _UNIT_COST[type(unit)](self, worker, unit)

    def _n(self, unit) -> int:
        return n_samples(unit, self.spg)

    def _generate(self, worker: Worker, unit: Generate) -> float:
        return (unit.t_end - unit.t_start) * self.c.forward(self._n(unit))

    def _reward(self, worker: Worker, unit: Reward) -> float:
        return self.c.reward(self._n(unit))

    def _train(self, worker: Worker, unit: Train) -> float:
        return len(unit.t_steps) * self.c.train_step(self._n(unit))

    def _optimizer(self, worker: Worker, unit: OptimizerStep) -> float:
        publish = self.c.weights_s if self._publishes and worker.id == "trainer-0" else 0.0
        return self.c.optimizer_s + publish

    def _sync(self, worker: Worker, unit: WeightSync) -> float:
        return self.c.weights_s


_UNIT_COST = by_kind(generate=MeasuredDurations._generate, reward=MeasuredDurations._reward,
                     train=MeasuredDurations._train, optimizer=MeasuredDurations._optimizer,
                     sync=MeasuredDurations._sync)


def steady_rate(run: RunContract, fn, steps: int, samples_per_step: int) -> float:
    """Simulated samples/s between the optimizer-step ends of digenrl.sim.report.window (as
    report.measure: pipeline fill and drain excluded)."""
    t0, t1, n = steady_window(run_virtual(Scheduler(run.sched, run.workers()), fn), steps)
    return samples_per_step * n / (t1 - t0)


@dataclass
class HerePlan:
    overrides: dict  # config key -> value: what the run uses
    rate: float  # predicted samples/s
    given_rate: Optional[float]  # predicted samples/s of the config as given (None: not runnable)
    evaluated: int

    def describe(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.overrides.items()) or "the config as given"
        base = f", as given {self.given_rate:.1f}" if self.given_rate else ""
        return f"plan=auto: {knobs} (predicted {self.rate:.1f} samples/s{base}; {self.evaluated} candidates)"


def _candidates(cfg: Config, fixed: set[str]) -> list[dict]:
    rt, d = cfg.runtime, cfg.data
    total = rt.rollout.workers + rt.trainer.workers
    mode = cfg.run.mode
    # Devices move between pools only when both pools reserve the same (the cluster was sized
    # for the pools as given, and the costs were measured on a trainer slot).
    alike = (rt.rollout.num_cpus, rt.rollout.num_gpus, rt.rollout.accelerator, rt.rollout.resources) == \
        (rt.trainer.num_cpus, rt.trainer.num_gpus, rt.trainer.accelerator, rt.trainer.resources)
    # A trainer gang holds several devices: the split stays as given (gangs move whole).
    if {"runtime.rollout.workers", "runtime.trainer.workers"} & fixed or mode == "colocated" or not alike \
            or rt.trainer.gang > 1:
        splits = [(rt.rollout.workers, rt.trainer.workers)]
    else:
        low = 0 if mode in TAG_MODES else 1
        splits = [(r, total - r) for r in range(low, total)]
    mbs = ([d.micro_batch_groups] if "data.micro_batch_groups" in fixed or d.micro_batch_samples
           else [m for m in range(1, d.groups_per_step + 1) if d.groups_per_step % m == 0])
    chunks = [cfg.train.tsp_chunk]
    if "train.tsp_chunk" not in fixed and (mode in TSP_MODES or mode in BATCH_MODES):
        k, counts = len(trained_steps(cfg, 0)), set()
        chunks = [c for c in range(1, k + 1) if -(-k // c) not in counts and not counts.add(-(-k // c))]
    return [{"runtime.rollout.workers": r, "runtime.trainer.workers": t, "data.micro_batch_groups": m,
             "train.tsp_chunk": c} for r, t in splits for m in mbs for c in chunks]


def plan_here(cfg: Config, lines: list[dict], *, cores: int, given: Optional[Iterable[str]] = (),
              steps: int = PLAN_STEPS) -> HerePlan:
    """The knobs (KNOBS not in `given`; None = all given, as Config.given says of a Config
    built in code) with the best simulated throughput for `cfg` on the costs measured in
    `lines`, with `cores` CPU cores shared by all workers (see module doc; pass a large
    number for GPU workers)."""
    costs = MeasuredCosts.from_lines(lines)
    fixed = set(KNOBS if given is None else given)
    samples = cfg.data.groups_per_step * cfg.data.group_size
    sim_cfg = copy.deepcopy(cfg)
    sim_cfg.train.steps = steps

    def rate(c: Config) -> float:
        run = contract(c)
        slow = max(1.0, len(run.workers()) * c.runtime.worker_threads / cores)  # reward workers too
        return steady_rate(run, MeasuredDurations(costs, run, slow), steps, samples)

    best, best_rate, n = None, -1.0, 0
    for point in _candidates(sim_cfg, fixed):
        try:
            c = with_overrides(sim_cfg, point)
        except ValueError:  # e.g. a split the mode cannot run
            continue
        r = rate(c)
        n += 1
        if r > best_rate * (1 + 1e-9):
            best, best_rate = point, r
    if best is None:
        raise ValueError("runtime.plan=auto: no candidate configuration is runnable")
    given_rate = rate(sim_cfg)
    tree = sim_cfg.to_dict()
    chosen = {k: v for k, v in best.items() if k not in fixed and v != dotted_get(tree, k)}  # the changes
    return HerePlan(chosen, best_rate, given_rate, n)

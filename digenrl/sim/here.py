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

The runtime around the units. A Ray run pays more than the units' compute: each unit is a
remote call whose inputs and outputs move through Ray's object store, the driver notices a
unit's end and sends the next, and the processes of the run (driver, Ray's daemons, the
evaluation actor) take their share of the cores. `RuntimeCosts.measure` reads these off a
short run of a candidate on its real actors (runtime.plan_probe_steps, the driver's probe):
per unit kind on each role, how much longer a unit took than its profiled, shared-core
charge (`ratio`), and the median gap between a unit's end and the start of the next unit
sent after it on the same worker (`dispatch_s`). A probed candidate is then priced with
both: a unit occupies its worker for ratio x charge + dispatch_s.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
import statistics
from typing import Callable, Iterable, Optional

from digenrl.config.schema import Config, dotted_get, with_overrides
from digenrl.config.contract import RunContract, contract, trained_steps
from digenrl.sched import (BATCH_MODES, KINDS, TAG_MODES, TSP_MODES, Generate, OptimizerStep, Reward, Scheduler,
                           Train, WeightSync, Worker, by_kind, kind)
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


@dataclass(frozen=True)
class RuntimeCosts:
    """What a Ray run pays around its units' compute, measured on a run of this machine."""

    # a unit's seconds in the run over its charge (profile x shared-core factor): per "kind@role"
    # (a trainer's one-step TAG segment pays more around it than a rollout worker's whole
    # trajectory), and per kind over every role, for a role the probe did not see do that kind
    ratio: dict
    dispatch_s: float  # median gap from a unit's end to the start of the next unit sent after it, same worker
    units: int  # spans measured

    LINE = "runtime"  # its line in a run's profile.jsonl ("what")

    @staticmethod
    def measure(spans, fn: "MeasuredDurations", *, steps: tuple[int, int]) -> "RuntimeCosts":
        """From a Ray run's spans (io/trace.py, with their units and "sent" times) and the
        charges `fn` (MeasuredDurations without runtime costs) of that run's contract: the spans
        of RL steps steps[0]..steps[1] (the driver's probe leaves out its first step, which
        warms the actors up, and its last, whose pipeline drains with fewer units side by side),
        lost ones left out."""
        workers = {w.id: w for w in fn.run.workers()}
        spans = sorted((s for s in spans if s.unit is not None and s.worker in workers
                        and not (s.extra or {}).get("lost")), key=lambda s: (s.worker, s.start))
        inside = lambda s: s.step is not None and steps[0] <= s.step <= steps[1]  # noqa: E731
        real, charged = {}, {}
        for s in filter(inside, spans):
            w, k = workers[s.worker], kind(s.unit)
            for key in (k, f"{k}@{w.role}"):
                real[key] = real.get(key, 0.0) + (s.end - s.start)
                charged[key] = charged.get(key, 0.0) + fn(w, s.unit)
        gaps = [b.start - a.end for a, b in zip(spans, spans[1:])
                if a.worker == b.worker and inside(b) and (b.extra or {}).get("sent", -1.0) >= a.end]
        if not real or not gaps:
            raise ValueError(f"the probe's trace has no unit in RL steps {steps[0]}..{steps[1]}: "
                             "runtime.plan_probe_steps must leave a step between the first and the last")
        n = sum(1 for s in spans if inside(s))
        return RuntimeCosts({k: real[k] / charged[k] for k in real if charged[k] > 0},
                            max(0.0, statistics.median(gaps)), n)

    def line(self) -> dict:
        return {"what": self.LINE, "ratio": self.ratio, "dispatch_s": self.dispatch_s, "units": self.units}

    @classmethod
    def from_lines(cls, lines: list[dict]) -> Optional["RuntimeCosts"]:
        """The probe's line of a run's profile.jsonl; None when the run had no probe."""
        rows = [r for r in lines if r.get("what") == cls.LINE]
        return cls(dict(rows[0]["ratio"]), rows[0]["dispatch_s"], rows[0]["units"]) if rows else None

    def of(self, worker: Worker, unit) -> float:
        """The ratio of `unit` on `worker`: its kind on the worker's role, else its kind, else 1."""
        k = kind(unit)
        return self.ratio.get(f"{k}@{worker.role}", self.ratio.get(k, 1.0))

    def describe(self) -> str:
        roles = sorted({key.split("@")[1] for key in self.ratio if "@" in key})
        parts = [f"{role} " + " ".join(f"{k} x{self.ratio[f'{k}@{role}']:.2f}" for k in KINDS.values()
                                       if f"{k}@{role}" in self.ratio) for role in roles]
        return ", ".join(parts) + f", dispatch {self.dispatch_s * 1e3:.1f} ms"


class MeasuredDurations:
    """duration_fn(worker, unit) -> seconds for a Config's contract on this machine: the
    profiled compute x the shared-core factor, and, with `runtime`, x the ratio of the unit's
    kind on the worker's role (RuntimeCosts.of) + the dispatch."""

    def __init__(self, costs: MeasuredCosts, run: RunContract, slowdown: float = 1.0,
                 runtime: Optional[RuntimeCosts] = None):
        self.c, self.run, self.k = costs, run, slowdown
        self.spg = run.sched.samples_per_group
        # trainer 0 publishes only when rollout workers pull (runtime/backend.py: publisher)
        self._publishes = any(w.role == "rollout" for w in run.workers())
        self.rt = runtime

    def __call__(self, worker: Worker, unit) -> float:
        s = self.k * _UNIT_COST[type(unit)](self, worker, unit)
        if self.rt is None:
            return s
        return s * self.rt.of(worker, unit) + self.rt.dispatch_s

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


def steady_step(run: RunContract, fn, steps: int, cores: float = 1.0, eval_s: float = 0.0) -> float:
    """Simulated seconds per RL step between the optimizer-step ends of
    digenrl.sim.report.window (as report.measure: pipeline fill and drain excluded), and
    `eval_s` CPU seconds a step of a process beside the workers (the evaluation actor) taken
    from them over the `cores` they share."""
    t0, t1, n = steady_window(run_virtual(Scheduler(run.sched, run.workers()), fn), steps)
    return (t1 - t0) / n + (eval_s / cores if eval_s else 0.0)


@dataclass
class HerePlan:
    overrides: dict  # config key -> value: what the run uses
    rate: float  # predicted samples/s
    given_rate: Optional[float]  # predicted samples/s of the config as given (None: not runnable)
    evaluated: int
    runtime: Optional[RuntimeCosts] = None  # what the probe measured around the units (None: no probe)
    probed: Optional[list] = None  # (changes, None = as given; rate priced with its own probe) per probe

    def describe(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.overrides.items()) or "the config as given"
        base = f", as given {self.given_rate:.1f}" if self.given_rate else ""
        probe = (f"; {len(self.probed)} probed, runtime {self.runtime.describe()}"
                 if self.runtime is not None else "")
        return f"plan=auto: {knobs} (predicted {self.rate:.1f} samples/s{base}; {self.evaluated} candidates{probe})"


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


def slowdown(cfg: Config, run: RunContract, cores: int) -> float:
    """The shared-core factor of `run` on `cores` CPU cores (module doc); reward workers count."""
    return max(1.0, len(run.workers()) * cfg.runtime.worker_threads / cores)


PROBED = 3  # candidates a probing plan runs: the config as given and the best others
PROBE_STEPS = 4  # RL steps of each probe where runtime.plan_probe_steps is None and the workers share cores


def probe_steps(setting: Optional[int], gpu: bool) -> int:
    """RL steps of each probe (0: none) for runtime.plan_probe_steps = `setting`: as set, else
    PROBE_STEPS where the workers share a node's CPU cores and none where each holds a GPU."""
    if setting is not None:
        return setting
    return 0 if gpu else PROBE_STEPS


def eval_cpu_s(cfg: Config, costs: MeasuredCosts, samples: int) -> float:
    """CPU seconds of held-out evaluation per RL step: `samples` per evaluation (held-out
    prompts x data.eval_samples), ODE-sampled in rollout batches (train/evaluation.py) over
    sampling.eval_num_steps and scored, every run.eval_every steps (0: only before and after,
    outside the steady state)."""
    if samples <= 0 or cfg.run.eval_every == 0:
        return 0.0
    d = cfg.data
    bs = d.micro_batch_samples or d.micro_batch_groups * d.group_size
    full, rest = divmod(samples, bs)
    one = lambda b: cfg.sampling.eval_num_steps * costs.forward(b) + costs.reward(b)  # noqa: E731
    return (full * one(bs) + (one(rest) if rest else 0.0)) / cfg.run.eval_every


def plan_here(cfg: Config, lines: list[dict], *, cores: int, given: Optional[Iterable[str]] = (),
              steps: int = PLAN_STEPS, probe: Optional[Callable[[Config], RuntimeCosts]] = None,
              eval_samples: int = 0) -> HerePlan:
    """The knobs (KNOBS not in `given`; None = all given, as Config.given says of a Config
    built in code) with the best simulated throughput for `cfg` on the costs measured in
    `lines`, with `cores` CPU cores shared by all workers (see module doc; pass a large
    number for GPU workers).

    `probe(config) -> RuntimeCosts` (the driver's runtime.plan_probe_steps): the compute-only
    ranking's best candidates and the config as given, PROBED in all, are each run and priced
    again with their own runtime costs, and the best of those is the plan. What the runtime
    adds depends on the split (how busy the shared cores are), so a candidate is priced only
    with what its own probe measured; the others are not chosen.

    `eval_samples`: samples per held-out evaluation (0: the run evaluates none). The
    evaluation actor's CPU (eval_cpu_s) is charged to every step as taken from the workers: a
    step lasts its simulated time + eval_cpu_s / cores (steady_step). The actor is niced, yet
    on the 2-core machine its CPU comes out of the workers' about whole (docs/measurements/default-run.md)."""
    costs = MeasuredCosts.from_lines(lines)
    fixed = set(KNOBS if given is None else given)
    samples = cfg.data.groups_per_step * cfg.data.group_size
    sim_cfg = copy.deepcopy(cfg)
    sim_cfg.train.steps = steps

    def rate(c: Config, runtime: Optional[RuntimeCosts] = None) -> float:
        run = contract(c)
        fn = MeasuredDurations(costs, run, slowdown(c, run, cores), runtime)
        return samples / steady_step(run, fn, steps, cores, eval_cpu_s(c, costs, eval_samples))

    ranked = []  # (compute-only rate, order, point, config)
    for point in _candidates(sim_cfg, fixed):
        try:
            c = with_overrides(sim_cfg, point)
        except ValueError:  # e.g. a split the mode cannot run
            continue
        ranked.append((rate(c), -len(ranked), point, c))
    if not ranked:
        raise ValueError("runtime.plan=auto: no candidate configuration is runnable")
    ranked.sort(key=lambda r: r[:2], reverse=True)  # ties: the earlier candidate
    tree = sim_cfg.to_dict()
    as_given = {k: dotted_get(tree, k) for k in KNOBS}
    changes = lambda point: {k: v for k, v in point.items() if k not in fixed and v != as_given[k]}  # noqa: E731
    if probe is None:
        best = ranked[0]
        return HerePlan(changes(best[2]), best[0], rate(sim_cfg), len(ranked))
    probed = [None] + [r for r in ranked if changes(r[2])][:PROBED - 1]  # None: the config as given
    priced = []
    for r in probed:
        c = sim_cfg if r is None else r[3]
        runtime = probe(cfg if r is None else with_overrides(cfg, r[2]))  # (the run's own train.steps)
        priced.append((rate(c, runtime), r, runtime))
    given_rate = priced[0][0]
    best_rate, best, runtime = max(priced, key=lambda p: p[0])  # ties: the config as given
    return HerePlan({} if best is None else changes(best[2]), best_rate, given_rate, len(ranked), runtime,
                    [(None if r is None else changes(r[2]), x) for x, r, _ in priced])

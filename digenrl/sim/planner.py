"""Planner: the knobs that give a mode its best simulated throughput on a testbed.

    grid(testbed, mode)   the search space, one axis per knob the mode uses
    plan(testbed, gpus)   cheap: analytic rollout/trainer split, then local search (multi-start)
    exhaustive(...)       brute force over the same grid (the reference the planner must hit)

Knobs (axes):
    n_rollout           rollout GPUs when the testbed's one pool is split (disaggregated modes);
                        from 0 in the TAG modes (every GPU a trainer, generating under TAG)
    offload             runtime.trainer.offload, where one GPU does not hold a full fine-tune
    memory              colocated-ideal: its memory layouts worth simulating (memory_axis: the
                        cheapest by forced costs, and each shipped peer's own layout that fits)
    micro_batch_groups  groups per micro-batch. GAP modes: whole prompt groups (advantages need
                        all rewards of a group), divisors of groups_per_step. Batch-level
                        modes (colocated, disagg-sync, one-step-off) train nothing before the
                        whole step is rewarded, so their units may cut prompt groups
                        (samples_per_group = 1): micro-batch = any divisor of the step's samples,
                        as flow_grpo spreads a group's samples over GPUs.
    tsp_chunk           trained steps per Train unit (TSP), values giving distinct chunk counts.
                        Batch-level modes use it for an even data-parallel share per trainer
                        (digenrl.config.contract: an explicit train.tsp_chunk acts in every mode).
    tag_segment         denoising steps per trainer Generate segment (TAG's give-back
                        granularity, the "TAG threshold"), divisors of denoise_steps
    gen_shard           GAP modes: Generate shards per micro-batch along the sample axis
                        (SHARDS, capped at group_size): more generating GPUs than micro-
                        batches, or one big group setting the step time, want > 1
    train_shard         TSP modes: Train units per (micro-batch, chunk) along the sample axis
                        (SHARDS): spreads the last micro-batches of a step over all trainers
                        (batch-level modes already cut groups with micro_batch_groups)
    reshard             disaggregated modes: runtime.trainer.reshard of the trainer gangs
                        (after-forward gathers per pass, after-step once per step but holds
                        the gathered model). The gang size is not an axis: each point takes
                        the smallest gang that holds the training state (workload.fitting_gang;
                        a larger gang adds collectives and ghost passes, and leaves fewer gangs for TSP)
    rollout_gang        video models with Ulysses attention (sim.sp), disaggregated modes:
                        GPUs per rollout worker, each trajectory sequence-parallel over them
                        (runtime.rollout.gang); sp.DEGREES the heads allow, within a node
    trainer_sp          the same inside a trainer gang (runtime.trainer.sp): the gang is then
                        the smallest multiple of it that fits. A point whose split does not
                        divide into these gangs runs at the nearest split that does (`snap`)

Every mode, baselines included, gets its best point of this search: the planner starts from
the baseline's own default (one unit per GPU, flow_grpo / verl style) and only moves uphill,
so a baseline is never configured worse than its default.

Speed, exactly. A candidate whose lower bound
(report.point_bound: the work it must do, each step's trainer work and shortest unit chain)
cannot beat the incumbent is not simulated, and a simulation stops as soon as its window shows
it cannot win (report.run_spec_within); neither could have been accepted, so the search takes the
path it takes without them (plan(prune=False) is that reference; tests/sim/test_planner.py
compares the two). A lag-0 run (on-policy modes, digenrl without TCSS) also stops once its
window closed and the syncs its last step started ended: nothing after weighs in its figures.
Lag-0 modes (report.ON_POLICY) are simulated for ON_POLICY_STEPS: each of their steps starts
from the same idle state, so 3 steps (one filling, one measured, one draining: report.window)
measure what 12 do (to ~1e-13).

The analytic split. Per sample, generation + reward takes g seconds on a rollout GPU and
training (all trained steps) t seconds on a trainer GPU; the pools are balanced when
R / g = (N - R) / t, i.e. R = N g / (g + t). A pool cannot use more GPUs than a step has units
for: at most P = samples per step x the rollout gang generate at once (a unit holds a sample at
least), and T = samples x trained steps x the smallest trainer gang that holds the training state
train at once (a Train unit holds a sample and a trained step at least). So R is then moved into
[N - T, P], and where the cluster is larger than P + T it is N - T: the trainers the step can
use, every other GPU a rollout worker (an idle trainer gang still joins every optimizer step's
barrier; an idle rollout worker only receives the weights). Local search (coordinate moves along
each axis to the neighbouring grid values, R also by +-2, +-4, ...) then absorbs the optimizer
step, syncs, tails and TAG (which moves generation onto trainers, so the best R is usually lower).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import product
from typing import Iterator, NamedTuple

from digenrl.sched import BATCH_MODES, GAP_MODES, MODES, TAG_MODES, TSP_MODES
from digenrl.sim.baselines import IDEAL
from digenrl.sim.costs import CostModel, JudgeServing
from digenrl.sim.costs import default_cost_model
from digenrl.sim.report import ON_POLICY, ideal_step_s, point_bound, run_spec, run_spec_within
from digenrl.sim.workload import RunSpec, draws_window, trainer_fit
from digenrl.sim.sp import degrees
from digenrl.sim.testbed import Testbed, resize

LINE_SEARCH_MAX = 40  # axes up to this length are line-searched whole
SHARDS = (1, 2, 4, 8)  # candidate sample shards per micro-batch (gen_shard: generation fragments; train_shard)
RESHARD = ("after-forward", "after-step")  # runtime.trainer.reshard
PLAN_STEPS = 12  # RL steps per evaluation: 4 fill, 6 measured, drain (report.measure)
EARLY_STOP = True  # _Evaluator: stop a simulation once its bound shows it cannot win
ON_POLICY_STEPS = 3  # ... for lag-0 modes, whose steps all start alike (_Evaluator)
PEER_ROWS = ("verl-omni", "genrl", "flow_grpo")  # the shipped peers simulate() puts beside colocated-ideal


@dataclass
class Plan:
    testbed: str
    gpus: int
    mode: str
    spec: RunSpec
    throughput: float  # samples/s, steady state
    step_s: float
    evaluated: int  # simulations run
    wall_s: float
    grid_size: int
    analytic_n_rollout: int | None = None
    history: list = field(default_factory=list, repr=False)
    pruned: int = 0  # candidates answered by their lower bound, not simulated

    def to_dict(self) -> dict:
        return dict(testbed=self.testbed, gpus=self.gpus, mode=self.mode, knobs=self.spec.knobs(),
                    throughput=self.throughput, step_s=self.step_s, evaluated=self.evaluated,
                    wall_s=self.wall_s, grid_size=self.grid_size, analytic_n_rollout=self.analytic_n_rollout,
                    pruned=self.pruned)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def grid(tb: Testbed, mode: str, style: str | None = None, cm: CostModel | None = None) -> dict[str, list]:
    """Axis name -> candidate values for `mode` (and colocated `style`) on `tb` (see module doc)."""
    axes: dict[str, list] = {}
    if mode == "colocated" and style == IDEAL:  # (style None: the runtime's colocated, one layout)
        mem = memory_axis(tb, cm)
        if len(mem) > 1:
            axes["memory"] = mem
    if mode != "colocated" and tb.split_pool:  # TAG: trainers generate, so no rollout pool at all is a plan too
        axes["n_rollout"] = list(range(0 if mode in TAG_MODES else 1, tb.n_gpus))
    if mode in BATCH_MODES:
        axes["micro_batch_groups"] = _divisors(tb.samples_per_step)
    else:
        axes["micro_batch_groups"] = _divisors(tb.groups_per_step)
    if mode in TSP_MODES or mode in BATCH_MODES:
        k, seen, vals = tb.trained_steps, set(), []
        for c in range(1, k + 1):
            if -(-k // c) not in seen:
                seen.add(-(-k // c))
                vals.append(c)
        axes["tsp_chunk"] = vals
    if mode in TAG_MODES:
        axes["tag_segment"] = _divisors(tb.denoise_steps)
    if mode != "colocated":  # trainer gangs: the smallest gang that fits either way (workload.fitting_gang)
        axes["reshard"] = list(RESHARD)
        if needs_offload_axis(tb):
            axes["offload"] = [False, True]
    if mode in GAP_MODES:
        shards = [k for k in SHARDS if k <= tb.group_size]
        axes["gen_shard"] = shards
        if mode != "gap":
            axes["train_shard"] = shards
    if mode != "colocated":
        axes.update(sp_axes(tb))
    return axes


def memory_axis(tb: Testbed, cm: CostModel | None = None) -> list[str]:
    """colocated-ideal's memory plans worth simulating: the cheapest that fits by its forced costs
    (baselines.colocated_plan), and each shipped peer's own layout where it fits, so that the
    ideal row can always run what a peer runs, without the peer's avoidable costs."""
    from digenrl.sim.baselines import colocated_plan, layout_fit, layouts
    from digenrl.sim.shipped import SYSTEMS, layout_of

    cm = cm or default_cost_model()
    p = tb.pools[0]
    kw = dict(gen_batch=tb.rollout_batch, train_batch=tb.micro_batch, lora=tb.lora, lora_rank=tb.lora_rank,
              grad_ckpt=tb.grad_ckpt, cfg=tb.cfg, train_cfg=tb.train_cfg, shape=tb.shape, kl=tb.kl, reward=tb.reward)
    best = colocated_plan(cm, tb.model, p.device, tb.n_gpus, gpus_per_node=p.gpus_per_node, denoise_steps=tb.denoise_steps,
                          intra=p.intra_link or tb.links.intra_node, inter=p.inter_link or tb.links.inter_node, **kw)
    out = [best["config"]] if best["fits"] else []
    names = {x.name: x for x in layouts(tb.n_gpus, p.gpus_per_node)}
    for sy in PEER_ROWS:
        lay = layout_of(SYSTEMS[sy])
        if lay.name in names and lay.name not in out and layout_fit(cm, lay, tb.model, p.device, tb.n_gpus,
                                                                    p.gpus_per_node, **kw).fits:
            out.append(lay.name)
    return out


def needs_offload_axis(tb: Testbed, cm: CostModel | None = None) -> bool:
    """Whether runtime.trainer.offload is worth searching: a full fine-tune whose training state
    one GPU of the trainer type does not hold (offload then lets a smaller gang, or any gang,
    hold it). Where a replica fits, offload only adds host copies."""
    if tb.lora:
        return False
    cm = cm or default_cost_model()
    dev = (tb.pool("trainer") or tb.pools)[0].device
    return not cm.fits(tb.model, ["trainer"], dev, train_batch=tb.micro_batch, lora=False, grad_ckpt=tb.grad_ckpt,
                       cfg=tb.train_cfg, shape=tb.shape, lora_rank=tb.lora_rank).fits


def sp_axes(tb: Testbed) -> dict[str, list[int]]:
    """rollout_gang / trainer_sp candidates (module doc): none for models without Ulysses
    attention or where the testbed fixes the degree; fixed pools: degrees dividing the pool."""
    axes = {}
    for axis, role in (("rollout_gang", "rollout"), ("trainer_sp", "trainer")):
        pools = tb.pool(role)
        pool = (pools or tb.pools)[0]
        vals = degrees(tb.model, pool.gpus_per_node)
        if pools:  # a fixed pool: its GPUs split into gangs of the degree
            vals = [d for d in vals if sum(p.count for p in pools) % d == 0]
        if getattr(tb, axis) is None and len(vals) > 1:
            axes[axis] = vals
    return axes


def snap(tb: Testbed, point: dict) -> dict:
    """`point` with n_rollout moved to the nearest split (ties: fewer rollout GPUs) whose
    rollout GPUs divide into rollout gangs and trainer GPUs into multiples of trainer_sp;
    unchanged when there is no split to move or none fits."""
    r = point.get("n_rollout")
    rg = point.get("rollout_gang") or tb.rollout_gang or 1
    sp = point.get("trainer_sp") or tb.trainer_sp or 1
    if r is None or (r % rg == 0 and (tb.n_gpus - r) % sp == 0):
        return point
    ok = [k for k in range(1, tb.n_gpus) if k % rg == 0 and (tb.n_gpus - k) % sp == 0]
    return {**point, "n_rollout": _nearest(ok, r)} if ok else point


def _spec(mode: str, point: dict, style: str | None, fixed: tuple = ()) -> RunSpec:
    spg = 1 if mode in BATCH_MODES else None
    return RunSpec(mode, samples_per_group=spg, style=style, **point, **dict(fixed))


def analytic_split(tb: Testbed, cm: CostModel | None = None) -> int:
    """R = N g / (g + t), rounded, moved into [N - T, P] where the pools cannot use their GPUs
    (`useful_gpus`; N - T where N > P + T), in [1, N - 1] (see module doc)."""
    cm = cm or default_cost_model()
    dev = tb.pools[0].device
    n = tb.n_gpus
    rb, mb = tb.rollout_batch, tb.micro_batch
    g = (float(cm.generate_s(tb.model, dev, rb, tb.denoise_steps, tb.cfg, tb.shape))
         + float(cm.reward_s(tb.model, dev, rb, tb.reward, tb.shape, JudgeServing.of(tb)))) / rb
    t = float(cm.train_chunk_s(tb.model, dev, mb, tb.trained_steps, tb.grad_ckpt, tb.lora, tb.train_cfg,
                               tb.shape)) / mb
    p, t_max = useful_gpus(tb, cm)
    return min(n - 1, max(1, n - t_max, min(p, round(n * g / (g + t)))))


def useful_gpus(tb: Testbed, cm: CostModel | None = None) -> tuple[int, int]:
    """(P, T): at most P rollout GPUs generate at once and T trainer GPUs train at once in a step
    of `tb`, whatever the knobs: a Generate unit holds a sample at least (P = samples per step
    x the largest rollout gang the search may pick, `sp_axes`), a Train unit a sample and a trained
    step at least, on the smallest gang that holds the training state (a multiple of the
    sequence-parallel degree, the largest the search may pick; the optimizer state on the GPU,
    else on the host): T = samples x trained steps x that gang, or N where no gang of the cluster
    holds it (no bound)."""
    n, s = tb.n_gpus, tb.samples_per_step
    axes = sp_axes(tb)
    rollout_gang = max(axes.get("rollout_gang") or [tb.rollout_gang or 1])
    sp = max(axes.get("trainer_sp") or [tb.trainer_sp or 1])
    for offload in (False, True):
        gang, rep = trainer_fit(tb, n, cm, sp=sp, offload=offload, any_size=True)
        if rep is not None and rep.fits:
            return s * rollout_gang, s * tb.trained_steps * gang
    return s * rollout_gang, n


def _nearest(values: list, target: float):
    return min(values, key=lambda v: (abs(v - target), v))


def default_point(tb: Testbed, mode: str, axes: dict, cm: CostModel | None = None) -> dict:
    """Where the search starts: the mode's own default configuration."""
    p: dict = {}
    if "n_rollout" in axes:
        p["n_rollout"] = analytic_split(tb, cm)
    if mode in BATCH_MODES:  # one unit per GPU that generates (flow_grpo / verl: batch / GPUs)
        gens = tb.n_gpus if mode == "colocated" else p.get("n_rollout", sum(
            q.count for q in tb.pool("rollout")))
        p["micro_batch_groups"] = _nearest(axes["micro_batch_groups"], tb.samples_per_step / gens)
    else:
        p["micro_batch_groups"] = 1
    if "tsp_chunk" in axes:  # batch-level: the even data-parallel share (digenrl.config.contract)
        p["tsp_chunk"] = axes["tsp_chunk"][0]
    if "tag_segment" in axes:
        p["tag_segment"] = axes["tag_segment"][0]
    for k in ("gen_shard", "train_shard"):  # unsharded units (the scheduler's default)
        if k in axes:
            p[k] = 1
    if "reshard" in axes:
        p["reshard"] = RESHARD[0]
    if "offload" in axes:  # the runtime's default: optimizer state on the GPU
        p["offload"] = False
    if "memory" in axes:  # the cheapest memory plan by its forced costs
        p["memory"] = axes["memory"][0]
    for k in ("rollout_gang", "trainer_sp"):  # no sequence parallelism (one GPU per trajectory)
        if k in axes:
            p[k] = 1
    return p


def _descend(ev, axes: dict, best: dict):
    """Coordinate search from `best` until no single-axis move improves throughput (`_descent`),
    alone: (best point, its result)."""
    return _descents(ev, axes, [best])[0]


def _descent(ev, axes: dict, best: dict):
    """Coordinate search from `best` until no single-axis move improves throughput. A candidate
    whose lower bound (report.point_bound) cannot beat the incumbent is not simulated: it could
    not have been accepted, so the search takes the same path as without pruning.

    A generator: before it asks for a line's candidates it yields (the line, the incumbent's step
    time, the next line's candidates as they would be were no move taken on this line), for its
    caller to start them on the evaluator's pool (`_descents`); it returns (best, best_r)."""
    best_r = ev(best)
    improved = True
    order = list(axes.items())

    def line_of(best: dict, axis: str, values: list) -> list[dict]:
        i = values.index(best[axis])
        if len(values) <= LINE_SEARCH_MAX:  # short axis: try every value
            idx = range(len(values))
        else:  # long axis (n_rollout on big clusters): neighbours and doubling jumps
            idx = [i + s * 2 ** e for e in range(12) for s in (-1, 1)]
        return [{**best, axis: values[j]} for j in idx if 0 <= j < len(values)]

    while improved:
        improved = False
        for a, (axis, values) in enumerate(order):
            # a move changes `best` on this axis only, so the line's candidates are known
            # before the first is tried: the evaluator may run them side by side (jobs)
            line = line_of(best, axis, values)
            yield line, best_r.step_s, line_of(best, *order[(a + 1) % len(order)])
            for cand in line:
                r = ev(cand, incumbent=best_r.step_s)
                if r.throughput > best_r.throughput * (1 + 1e-9):
                    best, best_r, improved = cand, r, True
    return best, best_r


def _descents(ev, axes: dict, starts: list) -> list:
    """[(best point, its result)] of a descent (`_descent`) from each of `starts`, in their order.

    On a pool of processes (jobs), up to as many descents as processes go on at once, taking
    turns a line at a time: a descent's line is started on the pool as it is reached, and while
    the parent reads one descent's line the processes work on the others'. A line of a short axis
    (reshard, offload: one new point) no longer leaves a process idle, nor does the end of a line
    whose points took unequal times. Only a descent going on alone starts the next line's points
    ahead (`_Evaluator.prefetch`), since those are simulated for nothing where a move is taken.

    Each descent takes the path it takes alone: the evaluator's answer to a point against an
    incumbent does not depend on what it holds from other descents (a result is the same
    whenever it was simulated; a bound or an early stop is used only where it shows that the point
    cannot beat this incumbent, and is asked again otherwise, `_Evaluator._known`). So the
    descents end where they end one after the other, and the plan is the same for any number of
    processes (`test_a_search_on_two_processes_chooses_what_one_process_does`)."""
    width = _JOBS if ev.pool is not None else 1  # (jobs() keeps _JOBS >= 1)
    out: list = [None] * len(starts)
    waiting = iter(enumerate(starts))
    going: deque = deque()

    def turn(i: int, g) -> None:  # the descent reads its started line, then starts its next one
        try:
            line, incumbent, ahead = next(g)
        except StopIteration as done:
            out[i] = done.value
            return
        ev.prefetch(line, incumbent, ahead=() if going else ahead, wait=False)
        going.append((i, g))

    while True:
        while len(going) < width:
            nxt = next(waiting, None)
            if nxt is None:
                break
            turn(nxt[0], _descent(ev, axes, nxt[1]))
        if not going:
            return out
        turn(*going.popleft())


# -- evaluating points side by side --------------------------------------------------------
_JOBS = 1  # processes plan() evaluates a search line's points in (`jobs`)
_CTX = None  # the search a pool's processes evaluate for (set before they fork)


@contextlib.contextmanager
def jobs(n: int | None) -> Iterator[None]:
    """plan() calls inside evaluate each line of the search on `n` processes (None: one per
    core). The search takes the same path and returns the same plan for any n (_Evaluator.prefetch)."""
    global _JOBS
    before, _JOBS = _JOBS, max(1, n or os.cpu_count() or 1)
    try:
        yield
    finally:
        _JOBS = before


_TASK = None  # the function side_by_side's processes call (set before they fork)


def side_by_side(fn, items: list) -> list:
    """[fn(x) for x in items], on the processes jobs() asks for (forked; each takes the next item
    once free, so put the longest first), results in the items' order. Inside them plan()
    evaluates serially: a pool's processes cannot start pools of their own. fn's result must
    pickle; an exception it raises is raised here."""
    global _TASK
    if _JOBS <= 1 or len(items) < 2 or not _fork_safe():
        return [fn(x) for x in items]
    _TASK = fn
    try:
        with _fork_pool(min(_JOBS, len(items))) as pool:
            return pool.map(_run_task, items, chunksize=1)
    finally:
        _TASK = None


def preload(tb: Testbed) -> None:
    """Import here what evaluating a point of `tb` imports, before processes fork from this
    one: a drawn SDE window's generator is torch's (workload.draws_window; about 1.5 s of CPU a
    process), which each forked process would import again."""
    if _JOBS > 1 and draws_window(tb):
        import digenrl.math.rng  # noqa: F401


def _fork_safe() -> bool:
    """Whether this process can fork workers: only when it runs no other thread. A fork copies the
    calling thread alone, so a lock another thread held at that moment (an import's, an
    allocator's) stays held in the child, which then waits on it forever: seen in a test worker
    whose Ray driver and wandb threads were running. Otherwise the search runs in this process;
    it takes the same path and returns the same plan (jobs())."""
    return threading.active_count() == 1


def _fork_pool(n: int):
    """n forked processes whose SIGTERM is the default: a pool ends by sending its processes
    SIGTERM, and a fork inherits the parent's handler. A process that started Ray has Ray's, which
    shuts Ray down (in a fork, a client whose threads did not come along: it hung, and the pool's
    join with it, in a test worker that had run a Ray test first). The default is in place in the
    parent while the pool forks, so a process has it from its first instruction: set only by the
    initializer, a process the pool ends before the initializer ran (one that took no task, on a
    busy machine) kept the parent's handler, and the pool's join waited on it. The initializer
    covers a process the pool forks later, to replace one that died."""
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # _fork_safe: the only thread, so the main one
    try:
        return multiprocessing.get_context("fork").Pool(n, initializer=_default_sigterm)
    finally:
        signal.signal(signal.SIGTERM, before)


def _default_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_task(item):
    with jobs(1):
        return _TASK(item)


class _Context(NamedTuple):
    """What evaluating a point reads: one plan() call's testbed, mode and settings."""

    tb: Testbed
    mode: str
    style: str | None
    steps: int
    cm: CostModel
    check_memory: bool
    prune: bool
    ideal: float | None
    fixed: tuple = ()  # (RunSpec field, value) pairs set on every point (plan(fixed=))


def _evaluate(ctx: _Context, spec: RunSpec, incumbent: float | None):
    """One point: (RunResult | _Pruned | _Infeasible, simulations run). With pruning, a point
    whose bound cannot beat `incumbent` is not simulated, and a simulation stops once it cannot."""
    tb, steps, cm = ctx.tb, ctx.steps, ctx.cm
    try:
        if ctx.prune and incumbent is not None and incumbent < float("inf") and ctx.check_memory:
            b = point_bound(tb, spec, steps, cm, ctx.ideal)
            if b.step_s >= incumbent * (1 + 1e-9):
                return _pruned(tb, spec, b.step_s), 0
            if not EARLY_STOP:
                return run_spec(tb, spec, steps, cm), 1
            r = run_spec_within(tb, spec, steps, cm, incumbent, b)
            return (_pruned(tb, spec, r) if isinstance(r, float) else r), 1
        if ctx.prune:  # nothing to cut it short against (no incumbent, or a peer's recipe, not
            # bounded): a lag-0 run still leaves out what follows its window
            return run_spec_within(tb, spec, steps, cm, float("inf"), None, ctx.check_memory), 1
        return run_spec(tb, spec, steps, cm, check_memory=ctx.check_memory), 1
    except ValueError as e:  # e.g. no trainer gang on this split holds the training state
        return _Infeasible(spec, str(e)), 0


def _pool_evaluate(job: tuple):
    return _evaluate(_CTX, *job)


class _Evaluator:
    """Simulates grid points once each (memo). `prune`: a point whose point_bound is at least the
    incumbent's step time is answered with its bound (_Pruned) instead, and simulated later if a
    worse incumbent asks again. Lag-0 modes (report.ON_POLICY) are simulated for ON_POLICY_STEPS:
    every step of theirs starts from the same idle state, so 3 steps measure what 12 do (equal
    to ~1e-13, tests/sim/test_planner.py)."""

    def __init__(self, tb, mode, style, steps, cm, check_memory=True, prune=True, pool=None, fixed=()):
        fast = prune and mode in ON_POLICY and steps >= ON_POLICY_STEPS and not dict(fixed).get("tcss_fraction")
        self.ctx = _Context(tb, mode, style, ON_POLICY_STEPS if fast else steps, cm, check_memory, prune,
                            ideal_step_s(tb, cm)["step_s"] if prune else None, tuple(fixed))
        self.pool = pool  # a process pool forked with _CTX = self.ctx (prefetch), or None
        self.cache: dict = {}
        self.running: dict = {}  # key -> the pool's pending answer of a point started ahead
        self.simulated = self.pruned = 0

    def _key(self, point: dict) -> tuple[dict, tuple]:
        point = snap(self.ctx.tb, point)
        return point, tuple(sorted(point.items()))

    def _known(self, key: tuple, incumbent: float | None) -> bool:
        """The cached answer stands: a result, or a bound the incumbent still cannot beat."""
        r = self.cache.get(key)
        return r is not None and not (isinstance(r, _Pruned) and (incumbent is None or r.bound < incumbent * (1 + 1e-9)))

    def _store(self, key: tuple, r, sims: int):
        self.simulated += sims
        self.pruned += isinstance(r, _Pruned)
        self.cache[key] = r
        return r

    def __call__(self, point: dict, incumbent: float | None = None):
        point, key = self._key(point)
        if key in self.running:  # started ahead on the pool: its answer, once there
            self._store(key, *self.running.pop(key).get())
        if self._known(key, incumbent):
            return self.cache[key]
        return self._store(key, *_evaluate(self.ctx, _spec(self.ctx.mode, point, self.ctx.style, self.ctx.fixed),
                                           incumbent))

    def prefetch(self, points: list[dict], incumbent: float | None, ahead: list[dict] = (),
                 wait: bool = True) -> None:
        """Evaluate the points not yet known on the pool, against `incumbent`, before the
        serial sweep asks for them one by one (it then finds them cached). The sweep's
        incumbent only improves while it goes: a point cut short or pruned against this one
        would be against the sweep's too, and a point run to its end here cannot beat an
        incumbent its run would have been stopped at. Either way the sweep moves as it would
        without the prefetch.

        `ahead`: points the sweep may ask for next (the next line, were no move taken on this
        one). Up to one fewer than the pool's processes of them are queued behind these points,
        so that a process this line leaves idle starts one; they go on while the sweep runs and
        their answers are taken when asked for (`running`). Their incumbent is this one, which
        the sweep's can only improve on within a descent, and a cached bound is asked again
        against a worse incumbent (`_known`): the sweep still moves as it would without them.

        `wait=False`: `points` go on as `ahead` ones do, their answers taken when asked for (the
        descents taking turns, `_descents`)."""
        if self.pool is None:
            return
        for key in [k for k, r in self.running.items() if r.ready()]:  # ahead points done: counted, cached
            self._store(key, *self.running.pop(key).get())
        todo: dict[tuple, dict] = {}
        spare: dict[tuple, dict] = {}
        for into, ps, most in ((todo, points, len(points)), (spare, ahead, max(1, _JOBS - 1))):
            for p in ps:  # those neither known nor taken yet
                if len(into) >= most:
                    break
                p, key = self._key(p)
                if key not in todo and key not in spare and key not in self.running and not self._known(key, incumbent):
                    into[key] = p
        if len(todo) + len(spare) < 2 and not self.running:
            return  # (one point alone: evaluated here, with no pool round trip)
        for key, p in [*todo.items(), *spare.items()]:
            self.running[key] = self.pool.apply_async(
                _pool_evaluate, ((_spec(self.ctx.mode, p, self.ctx.style, self.ctx.fixed), incumbent),))
        if wait:
            for key in todo:
                self._store(key, *self.running.pop(key).get())


def _pruned(tb: Testbed, spec: RunSpec, bound: float) -> "_Pruned":
    return _Pruned(spec, bound, tb.samples_per_step / bound / (1 + 1e-6))


@dataclass
class _Pruned:
    """A point not simulated: its step time is at least `bound`, no better than the incumbent's."""

    spec: RunSpec
    bound: float
    throughput: float  # below samples / bound: never accepted over an incumbent it could not beat
    step_s: float = float("inf")


@dataclass
class _Infeasible:
    """A grid point the runtime could not run: never better than any runnable point."""

    spec: RunSpec
    reason: str
    throughput: float = 0.0
    step_s: float = float("inf")


def plan(testbed: Testbed, gpus: int | None = None, mode: str = "digenrl", *, style: str | None = None,
         steps: int = PLAN_STEPS, cm: CostModel | None = None, start: dict | None = None,
         extra_starts: tuple = (), check_memory: bool = True, prune: bool = True,
         fixed: dict | None = None) -> Plan:
    """Best knobs for `mode` by analytic split + local search (coordinate moves). `extra_starts`:
    more points to descend from (simulate() seeds colocated-ideal with the peers' points, whose
    layouts it can run, so it is never slower than a peer). `fixed`: RunSpec fields set on every
    point, not searched (e.g. {"tcss_fraction": 0.5}: the best plan with TCSS at that fraction).
    Raises ValueError when no point of the grid runs (the reason: the nearest point's memory
    figure). prune=False: the same search with every candidate simulated for `steps` steps (the
    reference the pruned search must match)."""
    t0 = time.perf_counter()
    tb = resize(testbed, gpus)
    cm = cm or default_cost_model()
    axes = grid(tb, mode, style, cm)
    fixed = tuple(sorted((fixed or {}).items()))
    if any(k in axes for k, _ in fixed):
        raise ValueError(f"plan(fixed=): {[k for k, _ in fixed if k in axes]} are searched axes of {mode}")
    with _pool(tb, mode, style, steps, cm, check_memory, prune, fixed) as ev:
        return _plan(ev, tb, mode, style, cm, axes, start, extra_starts, t0)


@contextlib.contextmanager
def _pool(tb, mode, style, steps, cm, check_memory, prune, fixed=()) -> Iterator[_Evaluator]:
    """The search's evaluator, with a pool of _JOBS forked processes when jobs() asks for more than one."""
    global _CTX
    ev = _Evaluator(tb, mode, style, steps, cm, check_memory, prune, fixed=fixed)
    if _JOBS <= 1 or not _fork_safe():
        yield ev
        return
    _CTX = ev.ctx
    preload(tb)
    try:
        with _fork_pool(_JOBS) as pool:
            ev.pool = pool
            yield ev
    finally:
        _CTX = None


def _plan(ev: _Evaluator, tb, mode, style, cm, axes, start, extra_starts, t0) -> Plan:
    first = dict(start or default_point(tb, mode, axes, cm))
    # Multi-start: the default, and the default with a few micro-batch sizes (the split and
    # the unit size interact: a unit count that divides both pools evenly is a narrow ridge).
    mbs = axes["micro_batch_groups"]
    starts = [first] + [{**first, "micro_batch_groups": mbs[i]}
                        for i in sorted({0, len(mbs) // 3, 2 * len(mbs) // 3, len(mbs) - 1})]
    # ... and sharded units: sharding changes the best split (smaller units balance a
    # different rollout/trainer ratio), a ridge single-axis moves from unsharded miss.
    shard_axes = [k for k in ("gen_shard", "train_shard") if k in axes]
    for k in (axes[shard_axes[0]][1:] if shard_axes else []):
        starts += [{**first, a: k} for a in shard_axes]
        if len(shard_axes) > 1:
            starts.append({**first, **{a: k for a in shard_axes}})
    # ... and sequence parallelism: a gang changes the split and the unit sizes that balance
    # it, so the degrees start high too (each alone and together)
    sp_ax = [k for k in ("rollout_gang", "trainer_sp") if k in axes]
    for group in ([[a] for a in sp_ax] + ([sp_ax] if len(sp_ax) > 1 else [])):
        starts.append({**first, **{a: axes[a][-1] for a in group}})
    for extra in extra_starts:  # only the axes this grid has, on values it holds
        pt = {k: v for k, v in extra.items() if k in axes and v in axes[k]}
        starts.append({**first, **pt})
    # ... and, in a TAG mode, the split's other regime: every GPU a trainer gang that also
    # generates (n_rollout 0). The other knobs are tuned there first, with the split held:
    # at a split's knobs, the first rollout GPUs removed make the step slower before the last
    # ones make it faster, so a descent over every axis leaves that regime at once. Not where a
    # step cannot use every GPU (useful_gpus): there that regime keeps idle trainer gangs, each
    # in every optimizer step's barrier, where a split keeps idle rollout workers
    pinned = {"n_rollout": [0]} if axes.get("n_rollout", [None])[0] == 0 and first.get("n_rollout") else None
    all_trainer = [{**first, "n_rollout": 0}] if pinned and sum(useful_gpus(tb, cm)) >= tb.n_gpus else []
    # every descent's first point, side by side (jobs): each is simulated whole, with no
    # incumbent, as the descent would ask for it
    ev.prefetch(all_trainer + starts, incumbent=None)
    for s0 in all_trainer:
        starts.append(_descend(ev, {**axes, **pinned}, s0)[0])
    best, best_r = None, None
    for p, r in _descents(ev, axes, starts):
        if best_r is None or r.throughput > best_r.throughput * (1 + 1e-9):
            best, best_r = p, r
    if isinstance(best_r, _Infeasible):
        raise ValueError(f"no point of the {mode} grid runs; nearest: {_nearest_miss(ev).removeprefix(tb.name + ': ')}")
    size = 1
    for v in axes.values():
        size *= len(v)
    return Plan(tb.name, tb.n_gpus, mode, _with_gang(tb, best_r.spec), best_r.throughput, best_r.step_s, ev.simulated,
                time.perf_counter() - t0, size, analytic_split(tb, cm) if "n_rollout" in best else None, pruned=ev.pruned)


def _nearest_miss(ev: _Evaluator) -> str:
    """The reason of the refused point that came closest to fitting (fewest GiB per GPU)."""
    import re

    def gib(reason: str) -> float:
        m = re.search(r"(\d+) GiB per GPU", reason)
        return float(m.group(1)) if m else float("inf")
    return min((r.reason for r in ev.cache.values() if isinstance(r, _Infeasible)), key=gib)


def _with_gang(tb: Testbed, spec: RunSpec) -> RunSpec:
    """The spec with the trainer gang size it ran with written out (None: colocated)."""
    if spec.mode == "colocated" or spec.gang is not None:
        return spec
    from digenrl.sim.workload import config_for

    return replace(spec, gang=config_for(tb, spec, 1).runtime.trainer.gang)


def exhaustive(testbed: Testbed, gpus: int | None = None, mode: str = "digenrl", *,
               style: str | None = None, steps: int = PLAN_STEPS, cm: CostModel | None = None) -> Plan:
    """Best knobs for `mode` by simulating every point of `grid` (ties: first in grid order)."""
    t0 = time.perf_counter()
    tb = resize(testbed, gpus)
    cm = cm or default_cost_model()
    ev = _Evaluator(tb, mode, style, steps, cm, prune=False)
    best_r = None
    axes = grid(tb, mode, style, cm)
    for values in product(*axes.values()):
        r = ev(dict(zip(axes, values)))
        if best_r is None or r.throughput > best_r.throughput * (1 + 1e-9):
            best_r = r
    return Plan(tb.name, tb.n_gpus, mode, best_r.spec, best_r.throughput, best_r.step_s, len(ev.cache),
                time.perf_counter() - t0, len(ev.cache))

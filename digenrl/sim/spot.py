"""sim.spot: spot rollout pools on the virtual clock, then priced and planned.

A testbed pool with `spot:` (testbed.spot_spec: price, interruptions_per_hour, notice_s,
replace_s) holds preemptible rollout workers. One run (`run_spot`):

    testbed + RunSpec --contract--> workers (rollout-0, rollout-1, ...; the runtime's ids)
      sched.preemption.draw(spot workers, horizon, seed)  or  read_trace(path)
      --engine_events--> drains (at each notice), deadlines (notice + notice_s), joins
      --run_virtual (the real Scheduler)--> Trace
      --> throughput, $ per 1,000 samples, notices, deadlines missed, lost work

At a notice the worker drains (Scheduler.drain: it finishes its unit, or hands the trajectory
over at a rollout_segment boundary); if it is still there at the deadline it is lost
(Scheduler.worker_lost: its work is regenerated). A replacement (`rollout-3+1`) joins
replace_s after the notice, syncs weights, and is reclaimed by the same process in turn; it
runs on its line's device and is billed from its join. The draw's horizon is twice the
on-demand run's length, doubled until the spot run ends inside it (a longer horizon only adds
later events: draw's per-line streams are prefixes of each other), so the events are a
function of the seed alone.

Measured over the steady window (report.steady_window: optimizer-step ends steps // 3 and
steps - 2), for every row alike: throughput = samples / window seconds; cost = each worker's
GPU-hours alive inside the window at its price (spot price for spot workers, devices.py's
on-demand estimate otherwise). Lost work: GPU-seconds of units a deadline cut
(`lost_gpu_s`), the trajectories they were generating (`regenerated_samples`), and the
denoising sample-steps generated again (`regenerated_steps`: a cut unit's whole range, rerun
from its t_start, plus whatever completed work a restart from t=0 repeats; 0 without losses).

`plan_spot` prices one rollout pool by size (whole nodes) and mix: on-demand only, some nodes
spot, all spot, each size with DigenRL's on-demand plan for it (the planner does not search
under preemption), averaged over seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from digenrl.sched import Scheduler, Worker
from digenrl.sched.preemption import Event, Join, Notice, draw, engine_events
from digenrl.sched.units import Generate, rows
from digenrl.sim.costs import CostModel, default_cost_model
from digenrl.sim.devices import get_device
from digenrl.sim.engine import run_virtual
from digenrl.sim.report import spec_duration_fn, steady_window
from digenrl.sim.testbed import Pool, Testbed, spot_spec
from digenrl.sim.workload import RunSpec

SPOT_STEPS = 24  # RL steps per spot run: a steady window of 14 steps (report.steady_window)


@dataclass
class SpotResult:
    """One run with its preemptions, measured over the steady window (module doc)."""

    testbed: str
    seed: int | None  # None: the events came from a trace file
    spot_workers: int
    rollout_workers: int
    step_s: float
    throughput: float  # trained samples per second
    usd_per_1k: float  # USD per 1,000 trained samples
    notices: int  # notices delivered during the run
    drained: int  # noticed workers that left before their deadline
    deadlines_missed: int  # noticed workers still there at their deadline: lost
    drains_refused: int  # notices the scheduler could not drain (the last rollout worker, no TAG)
    joins: int
    lost_gpu_s: float  # GPU-seconds of units a deadline cut
    regenerated_samples: int  # trajectories those cut Generate units held
    regenerated_steps: int  # denoising sample-steps generated again: cut units rerun whole, and restarts
    run_s: float  # the whole run, virtual seconds
    events: list = field(default_factory=list, repr=False)
    trace: object = field(default=None, repr=False)


def spot_lines(layout) -> dict:
    """worker id -> SpotSpec of the rollout workers a durations.Layout places on spot pools."""
    return {w.id: layout.pool[w.id].spot for w in layout.workers
            if w.role == "rollout" and layout.pool[w.id].spot is not None}


def draw_run(lines: dict, horizon_s: float, seed: int) -> list[Event]:
    """The seeded notices and joins of the spot workers `lines` (id -> SpotSpec): line i of
    the run's spot workers keeps stream (seed, i) whichever pool it sits in."""
    ids = list(lines)
    events: list[Event] = []
    for spec in dict.fromkeys(lines.values()):
        mine = {w for w in ids if lines[w] == spec}
        events += [e for e in draw(spec, ids, horizon_s, seed) if e.worker.split("+")[0] in mine]
    return sorted(events, key=lambda e: (e.at_s, isinstance(e, Join), e.worker))


def run_spot(tb: Testbed, spec: RunSpec, steps: int = SPOT_STEPS, cm: CostModel | None = None,
             seed: int | None = None, events: list[Event] | None = None) -> SpotResult:
    """Simulate `spec` on `tb` with its spot pools reclaimed: the seeded process (`seed`, default
    the run's `run.seed`) or the given `events` (sched.preemption.read_trace). ValueError when an
    event names a worker the run does not have, or when the run cannot finish (every rollout
    worker gone, nothing to replace it, no TAG)."""
    cm = cm or default_cost_model()
    cfg, run, fn = spec_duration_fn(tb, spec, steps, cm)
    lay = fn.layout
    lines = spot_lines(lay)
    if events is not None:
        _check_events(events, lay.workers)
        return _run(tb, spec, steps, cm, lines, events, None)
    seed = cfg.run.seed if seed is None else seed
    base = run_virtual(Scheduler(run.sched, lay.workers), fn)  # the on-demand run sets the horizon
    horizon = 2.0 * base.end
    while True:
        evs = draw_run(lines, horizon, seed)
        res = _run(tb, spec, steps, cm, lines, evs, seed)
        if res.run_s < horizon:
            return res
        horizon *= 2.0


def _check_events(events: list[Event], workers: Sequence[Worker]) -> None:
    known = {w.id for w in workers if w.role == "rollout"}
    for e in events:
        if isinstance(e, Join):
            known.add(e.worker)
        elif e.worker not in known:
            raise ValueError(f"preemption trace: a notice at {e.at_s} s names {e.worker!r}, not a rollout worker "
                             f"of this run (rollout workers: {sorted(w.id for w in workers if w.role == 'rollout')})")


def _run(tb: Testbed, spec: RunSpec, steps: int, cm: CostModel, lines: dict, events: list[Event],
         seed) -> SpotResult:
    _, run, fn = spec_duration_fn(tb, spec, steps, cm)  # a fresh DurationFn: its worker state starts clean
    lay = fn.layout
    by_id = {w.id: w for w in lay.workers}

    def origin(wid: str) -> Worker:  # a replacement runs on its line's GPUs
        return by_id[wid.split("+")[0]]

    def duration(worker: Worker, unit) -> float:
        return fn(worker if worker.id in by_id else origin(worker.id), unit)

    drains, deadlines, joins = engine_events(events)
    sched = Scheduler(run.sched, lay.workers)
    try:
        trace = run_virtual(sched, duration, drains=drains, deadlines=deadlines,
                            joins=[(t, Worker(w, "rollout")) for t, w in joins])
    except RuntimeError as e:  # deadlock: no rollout worker left and none coming
        raise ValueError(f"{tb.name}: the run cannot finish under these preemptions: {e}") from None
    t0, t1, n = steady_window(trace, steps)
    samples = tb.samples_per_step * n
    usd = 0.0
    for wid, (joined, left) in trace.alive.items():
        w = origin(wid)
        line = w.id
        price = lines[line].price if line in lines else get_device(lay.device[line]).usd_per_hour
        hours = max(0.0, min(t1, trace.end if left is None else left) - max(t0, joined)) / 3600.0
        usd += price * lay.gpus.get(line, 1) * hours
    spg = run.sched.samples_per_group
    lost_s, cut, executed, again = 0.0, 0, 0, 0
    for s in trace.spans:
        lost = bool(s.extra and s.extra.get("lost"))
        if lost:
            lost_s += (s.end - s.start) * lay.gpus.get(origin(s.worker).id, 1)
        if type(s.unit) is Generate:
            a, b = rows(s.unit, spg)
            sample_steps = (b - a) * (s.unit.t_end - s.unit.t_start)
            if lost:  # run again from its t_start: the whole unit is generated twice
                cut += b - a
                again += sample_steps
            else:
                executed += sample_steps
    needed = tb.samples_per_step * steps * run.sched.num_steps  # executed - needed: restarts from t=0
    notices = [e for e in events if isinstance(e, Notice) and e.at_s < trace.end]
    missed = len(trace.preemption["missed"]) if deadlines else 0
    left = {n.worker: trace.alive.get(n.worker, [0.0, None])[1] for n in notices}
    drained = sum(1 for n in notices if left[n.worker] is not None and left[n.worker] < n.deadline_s)
    return SpotResult(tb.name, seed, len(lines), sum(w.role == "rollout" for w in lay.workers), (t1 - t0) / n,
                      samples / (t1 - t0), 1000.0 * usd / samples, len(notices), drained, missed,
                      len(trace.preemption["refused"]) if deadlines else 0,
                      sum(1 for e in events if isinstance(e, Join) and e.at_s < trace.end),
                      lost_s, cut, again + executed - needed, trace.end, events, trace)


# ----------------------------------------------------------------------------- planning


@dataclass
class SpotRow:
    """One mix of a rollout pool, averaged over seeds."""

    label: str  # "on-demand", "8 of 16 spot", "all spot"
    spot_gpus: int
    rollout_gpus: int
    throughput: float
    usd_per_1k: float
    notices: float  # means per run
    deadlines_missed: float
    lost_gpu_s: float
    regenerated_samples: float
    regenerated_steps: float
    notices_per_hour: float  # expected: spot workers x interruptions_per_hour
    pools: tuple = ()  # the rollout pools of this row
    spec: RunSpec | None = None  # DigenRL's plan for this pool size
    testbed: Testbed | None = field(default=None, repr=False)


def with_spot(tb: Testbed, spot_gpus: int, spec) -> Testbed:
    """`tb` with its (one) rollout pool cut in two: `spot_gpus` GPUs on spot under `spec`, first,
    and the rest on demand. Whole nodes on both sides unless the pool fits in one node."""
    (pool,) = tb.pool("rollout")
    rest = pool.count - spot_gpus
    parts = [dataclasses.replace(pool, name=f"{pool.name}-spot", count=spot_gpus, spot=spec)] if spot_gpus else []
    if rest:
        parts.append(dataclasses.replace(pool, name=pool.name if not spot_gpus else f"{pool.name}-on-demand",
                                         count=rest, spot=None))
    pools = tuple(p for p in tb.pools if p.role != "rollout") + tuple(parts)
    return dataclasses.replace(tb, pools=pools, name=tb.name if not spot_gpus else f"{tb.name}:spot{spot_gpus}")


def mixes(pool: Pool) -> list[int]:
    """Spot GPU counts tried on a rollout pool: by whole nodes (0, one node, ..., all), or 0, half
    and all when the pool fits in one node."""
    if pool.count <= pool.gpus_per_node:
        return sorted({0, pool.count // 2, pool.count})
    return list(range(0, pool.count + 1, pool.gpus_per_node))


def sizes(pool: Pool) -> list[int]:
    """Rollout pool sizes `plan --spot` tries: whole nodes, one node up to the pool's count (a
    pool within one node: its count only)."""
    if pool.count <= pool.gpus_per_node:
        return [pool.count]
    return list(range(pool.gpus_per_node, pool.count + 1, pool.gpus_per_node))


def resized(tb: Testbed, count: int) -> Testbed:
    """`tb` with its one rollout pool holding `count` GPUs."""
    (pool,) = tb.pool("rollout")
    if count == pool.count:
        return tb
    return dataclasses.replace(tb, pools=tuple(dataclasses.replace(p, count=count) if p is pool else p
                                               for p in tb.pools), name=f"{tb.name}:rollout{count}")


def plan_spot(tb: Testbed, steps: int = SPOT_STEPS, seeds: int = 8, cm: CostModel | None = None,
              interruptions_per_hour: float | None = None, spec: RunSpec | None = None,
              sized: bool = True) -> list[SpotRow]:
    """One SpotRow per (rollout pool size, mix): sizes by whole nodes up to the pool's count
    (`sized`; else its count only), and for each, on demand only, by whole nodes of spot (or
    half), all spot. The spot terms are the pool's `spot:` or its device's estimates;
    `interruptions_per_hour` replaces the rate (a what-if). Each size runs DigenRL's plan for
    that size on demand (or `spec` for all), averaged over seeds 0..seeds-1."""
    from digenrl.sim.simulate import digenrl_plan

    cm = cm or default_cost_model()
    rollout = tb.pool("rollout")
    if len(rollout) != 1:
        raise ValueError(f"{tb.name}: --spot prices one rollout pool (role rollout); this testbed has "
                         f"{len(rollout)} (a split pool of role 'any' has none: give the pools fixed roles)")
    pool = rollout[0]
    sp = pool.spot or spot_spec({}, pool.device, f"key 'pools[{tb.pools.index(pool)}].spot")
    if interruptions_per_hour is not None:
        sp = dataclasses.replace(sp, interruptions_per_hour=interruptions_per_hour)
    out = []
    for n in (sizes(pool) if sized else [pool.count]):
        at = resized(tb, n)
        plan = spec or digenrl_plan(with_spot(at, 0, None), cm=cm).spec
        for k in mixes(at.pool("rollout")[0]):
            where = with_spot(at, k, sp)
            runs = [run_spot(where, plan, steps, cm, seed=s) for s in range(seeds)]
            label = f"{n}x {pool.device}: " + ("on-demand" if k == 0 else "all spot" if k == n else f"{k} spot")
            m = {k_: _mean(runs, lambda r, k_=k_: getattr(r, k_)) for k_ in (
                "throughput", "usd_per_1k", "notices", "deadlines_missed", "lost_gpu_s", "regenerated_samples",
                "regenerated_steps")}
            out.append(SpotRow(label, k, n, **m, notices_per_hour=runs[0].spot_workers * sp.interruptions_per_hour,
                               pools=where.pool("rollout"), spec=plan, testbed=where))
    return out


def _mean(runs: list, f) -> float:
    return sum(f(r) for r in runs) / len(runs)


def pool_yaml(p: Pool) -> str:
    """A testbed pool as the YAML line `pools:` takes."""
    keys = [f"name: {p.name}", f"count: {p.count}", f"device: {p.device}", f"role: {p.role}",
            f"gpus_per_node: {p.gpus_per_node}"]
    keys += [f"{k}: {getattr(p, k)}" for k in ("intra_link", "inter_link") if getattr(p, k)]
    if p.spot is not None:
        s = p.spot
        keys.append(f"spot: {{price: {s.price:g}, interruptions_per_hour: {s.interruptions_per_hour:g}, "
                    f"notice_s: {s.notice_s:g}, replace_s: {'null' if s.replace_s is None else f'{s.replace_s:g}'}}}")
    return "  - {" + ", ".join(keys) + "}"


# ----------------------------------------------------------------------------- printing


def spot_dict(r: SpotResult) -> dict:
    """A SpotResult's figures (no events, no trace) for JSON."""
    return {k: v for k, v in dataclasses.asdict(dataclasses.replace(r, events=[], trace=None)).items()
            if k not in ("events", "trace")}


def spot_line(r: SpotResult, trace_path: str | None = None) -> str:
    """The preempted digenrl run under `digenrl simulate`'s table."""
    where = f"trace {trace_path}" if trace_path else f"seed {r.seed}"
    return (f"digenrl under preemption ({where}; {r.spot_workers} of {r.rollout_workers} rollout workers priced as spot): "
            f"{r.throughput:.3f} smp/s, ${r.usd_per_1k:.2f} per 1,000 samples; {r.notices} notices, "
            f"{r.drained} drained in time, {r.deadlines_missed} deadlines missed, {r.drains_refused} drains refused, "
            f"{r.joins} replacements; lost {r.lost_gpu_s:.0f} GPU-s, {r.regenerated_samples} samples and "
            f"{r.regenerated_steps} denoising sample-steps regenerated")


def spot_table(tb: Testbed, rows: list[SpotRow], steps: int, seeds: int) -> str:
    """plan_spot's rows, with each row's ratio (samples per $) to the testbed's pool on demand."""
    base = next(r for r in rows if r.spot_gpus == 0 and r.rollout_gpus == tb.pool("rollout")[0].count)
    pool = tb.pool("rollout")[0]
    sp = next((p.spot for r in rows for p in r.pools if p.spot is not None), None)
    head = (f"== {tb.name}: rollout pool {pool.count}x {pool.device}; spot "
            + (f"${sp.price:g}/GPU-h, {sp.interruptions_per_hour:g} reclaims/worker-h, notice {sp.notice_s:g} s, "
               f"replacement {'none' if sp.replace_s is None else f'{sp.replace_s:g} s'}" if sp else "-")
            + f"; {steps} RL steps x {seeds} seeds")
    cols = (f"{'rollout pool':<20} {'smp/s':>7} {'$/1k smp':>9} {'vs on-demand':>13} {'notices/h':>10} {'notices':>8} "
            f"{'missed':>7} {'lost GPU-s':>11} {'regen smp':>10} {'regen steps':>12}")
    lines = [head, cols, "-" * len(cols)]
    for r in rows:
        lines.append(f"{r.label:<20} {r.throughput:>7.3f} {r.usd_per_1k:>9.3f} {base.usd_per_1k / r.usd_per_1k:>12.3f}x "
                     f"{r.notices_per_hour:>10.3g} {r.notices:>8.2f} {r.deadlines_missed:>7.2f} {r.lost_gpu_s:>11.1f} "
                     f"{r.regenerated_samples:>10.1f} {r.regenerated_steps:>12.1f}")
    return "\n".join(lines)

"""Virtual-clock event loop: drives the real scheduler with cost-model durations.

    assign() --> start units: push (now + duration_fn(worker, unit)) on a heap
       ^                                      |
       +---- complete(w, unit) <-- pop the earliest completion (or a scheduled loss/join/drain)

The scheduler cannot tell this loop from the Ray runtime: same events, same order rules.
Ties on the clock break by push order, so a run is deterministic.
"""

from __future__ import annotations

import gc
import heapq
from itertools import groupby, repeat
from typing import Callable, Iterable, Optional

from digenrl.sched import Scheduler, SchedulerError, Unit, Worker, kind
from digenrl.sched.units import KINDS as _KINDS
from digenrl.sched.units import OptimizerStep, Reward, Train, WeightSync
from digenrl.io.trace import Span, Trace

_DONE, _LOST, _JOIN, _DRAIN, _DEADLINE = 0, 1, 2, 3, 4


def run_virtual(scheduler: Scheduler, duration_fn: Callable[[Worker, Unit], float], *,
                failures: Iterable[tuple[float, str]] = (),
                joins: Iterable[tuple[float, Worker]] = (),
                drains: Iterable[tuple[float, str]] = (),
                deadlines: Iterable[tuple[float, str]] = (),
                record: bool = True,
                max_events: Optional[int] = None,
                on_version: Optional[Callable[[int, float], bool]] = None,
                until_synced: Optional[int] = None,
                quiet_syncs: bool = True,
                batched: bool = True,
                classes: bool = True) -> Trace:
    """Run `scheduler` to completion on a virtual clock and return its Trace.

    duration_fn(worker, unit) -> seconds (the cost model). `failures`: (time, worker_id)
    losses; `joins`: (time, Worker) arrivals; `drains`: (time, worker_id) requests to leave
    (Scheduler.drain; the worker's alive interval ends when it has left). `deadlines`: (time,
    worker_id) ends of a preemption notice (sched.preemption.engine_events): the worker is lost
    then if it is still there, and nothing happens if it already left (drained or lost). A drain
    of a worker that has a deadline is a notice: when the scheduler refuses it (the last rollout
    worker of a mode without TAG) the worker keeps working until its deadline takes it, and
    `trace.preemption` lists it under "refused"; deadlines that found their worker still there
    are listed under "missed". `record=False` keeps only counters (for very large runs).
    `on_version(version, now)`: called when the trainers' version advances (an
    optimizer step ended); True stops the run there (`trace.stopped`; the planner's early stop,
    report.run_spec_within). `until_synced`: a version; the run stops (`trace.stopped`) at the
    first event after which the trainers hold it and no weight sync is in flight (a lag-0 run's
    window closed and the syncs that count for its last step ended, report.run_spec_within).
    Raises RuntimeError on deadlock (nothing running, not done).

    `quiet_syncs` (exact; False is the reference, tests/sim/test_engine_fast.py): a weight sync
    that ends right after another one of the same version whose completion only returned its
    worker idle (Scheduler.parks) and whose assign() started nothing does not call assign() when
    it parks too. All that sync's completion changed is one more idle rollout worker at that
    version (and one sync fewer in flight, which leaves TAG's reserve, syncing + idle rollout
    workers, as it was): any work such a worker could take, the first one already would have.
    A large rollout pool's syncs (one per worker and version) are most events.

    `classes` (exact; False is the reference): identical workers in one state are one class.
    The same rule for the OptimizerSteps of one barrier that do not end it (the trainer joins
    the idle trainers; during the barrier an idle trainer may only take a Reward, which the
    first one would have taken), and the completions of such a class that end together (one
    heap entry, `batched`) are resolved at once (Scheduler.complete_parked: one call for the
    run of them, no assign() in between): a 65,536-GPU cluster's idle rollout workers and
    trainer gangs cost a loop iteration each per version, not an event. They split apart when
    something sets one apart: a loss, a drain or a notice, pinned work, a unit that ends at
    another time (another device), the barrier's last OptimizerStep (which advances the version
    and is an event of its own).

    `batched` (exact; False is the reference): units launched together that end at the same
    time share one heap entry, processed in launch order. Their entries (end, seq) would have
    had consecutive seqs, so nothing else could pop between them (whatever is pushed meanwhile
    has a later seq): the same events in the same order, fewer heap operations (a sync wave of
    a large rollout pool, the optimizer barrier of many trainer gangs). A wave
    (Scheduler.last_waves: one unit object to an idle class's workers, a WeightSync to the rollout
    workers idle at one version or a barrier's OptimizerStep to the parked trainers) is also launched at once:
    priced in one call (`duration_fn.wave(workers, ids, unit)` where it has one, DurationFn.wave),
    its runs of equal seconds pushed as such entries, its workers sharing one token (the seq the
    first would have had; later seqs as if each had taken one).
    Python's cyclic garbage collector is off while the loop runs (the run allocates a span,
    a heap entry and a unit per event, all kept or freed by reference counting; each collection
    walked every object the process holds, up to ~40% of a large run); it is restored after.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(scheduler, duration_fn, failures, joins, drains, deadlines, record, max_events, on_version,
                    quiet_syncs, batched, classes, until_synced)
    finally:
        if enabled:
            gc.enable()


def _run(scheduler, duration_fn, failures, joins, drains, deadlines, record, max_events, on_version, quiet_syncs,
         batched, classes, until_synced=None) -> Trace:
    workers: dict[str, Worker] = {w.id: w for w in scheduler.workers}
    trace = Trace(workers={wid: w.role for wid, w in workers.items()},
                  alive={wid: [0.0, None] for wid in workers})
    failures, joins, drains, deadlines = list(failures), list(joins), list(drains), list(deadlines)
    noticed = {wid for _, wid in deadlines}  # their drains are notices (see the docstring)
    gone: set[str] = set()  # workers lost or drained (a deadline after that is met)
    if deadlines:
        trace.preemption = {"missed": [], "refused": []}
    # kinds whose completion may only return a worker to its idle class (Scheduler.parks); none
    # under max_events, which counts every event before the next assign()
    quiet_steps = classes and max_events is None
    quiet_syncs = quiet_syncs and max_events is None
    # without losses, joins or drains (none before the run either) every rollout worker's sync
    # parks it (nothing is pinned on a syncing worker, none is draining or stale): no need to ask
    no_events = not (failures or joins or drains or deadlines or scheduler.draining)
    quiet = None  # (kind, version) of the last event: a completion that parked, whose assign() started nothing
    heap: list = []
    seq = 0
    running: dict[str, tuple[float, Unit, int, int]] = {}  # wid -> (start, unit, version, token)
    for t, wid in failures:
        heap.append((float(t), seq, _LOST, wid)); seq += 1
    for t, w in joins:
        heap.append((float(t), seq, _JOIN, w)); seq += 1
    for t, wid in drains:
        heap.append((float(t), seq, _DRAIN, wid)); seq += 1
    for t, wid in deadlines:
        heap.append((float(t), seq, _DEADLINE, wid)); seq += 1
    heapq.heapify(heap)
    now, n_events = 0.0, 0
    version = scheduler.version
    spans = trace.spans
    push, pop = heapq.heappush, heapq.heappop

    assign, complete = scheduler.assign, scheduler.complete
    bts = scheduler.cfg.bts
    parks, complete_parked, expect_all = scheduler.parks, scheduler.complete_parked, scheduler.expect_all

    wave_fn = getattr(duration_fn, "wave", None)  # a wave's prices at once (DurationFn.wave)

    def launch() -> int:
        nonlocal batch, t_batch
        v = scheduler.version
        started = assign()
        batch, t_batch = None, None
        told = [] if bts else None  # BTS learns each unit's seconds when it completes, as from a measurement
        waves = scheduler.last_waves if batched else ()
        i = 0
        for a, b in waves:  # the units before the wave one by one, then the wave at once
            if i < a:
                _one_by_one(started, i, a, v, told)
            _wave(started, a, b, v, told)
            i = b
        if i < len(started):
            _one_by_one(started, i, len(started), v, told)
        if told:  # (scheduler.expect for each, at once: nothing reads the scheduler in between)
            expect_all(told)
        return len(started)

    batch, t_batch = None, None

    def _one_by_one(started, i, j, v, told) -> None:
        nonlocal seq, batch, t_batch
        for wid, unit in (started[i:j] if i or j < len(started) else started):
            dt = duration_fn(workers[wid], unit)
            if dt < 0:
                raise ValueError(f"duration_fn returned {dt} < 0 for {unit} on {wid}")
            if bts:
                told.append(((wid,), unit, dt))
            running[wid] = (now, unit, v, seq)
            t = now + dt
            if batched and t == t_batch:  # same end as the previous unit: the same heap entry
                batch.append((wid, unit, seq))
            else:
                batch, t_batch = [(wid, unit, seq)], t
                push(heap, (t, seq, _DONE, batch))
            seq += 1

    def _wave(started, i, j, v, told) -> None:
        """started[i:j], one wave (Scheduler.last_waves), as _one_by_one would: priced in one
        call, and each run of equal seconds in one heap entry (or the previous one, ending then
        too), its workers sharing one token (the seq the first of them would have had; a worker
        is in a wave once, so a token still tells its launch from a later one)."""
        nonlocal seq, batch, t_batch
        unit = started[i][1]
        wids = [a[0] for a in started[i:j]]
        dts = (wave_fn(workers, wids, unit) if wave_fn is not None
               else [duration_fn(workers[wid], unit) for wid in wids])
        k = 0
        for dt, run in ([(dts[0], None)] if dts.count(dts[0]) == len(dts) else groupby(dts)):
            c = len(dts) if run is None else sum(1 for _ in run)
            if dt < 0:
                raise ValueError(f"duration_fn returned {dt} < 0 for {unit} on {wids[k]}")
            part = wids[k:k + c] if c < len(wids) else wids
            k += c
            if bts:
                told.append((part, unit, dt))
            running.update(zip(part, repeat((now, unit, v, seq))))
            t = now + dt
            entries = list(zip(part, repeat(unit), repeat(seq)))
            if t == t_batch:
                batch.extend(entries)
            else:
                batch, t_batch = entries, t
                push(heap, (t, seq, _DONE, batch))
            seq += c

    launch()
    stop = False
    KINDS = _KINDS
    while not scheduler.done and not stop:
        if not heap:
            raise RuntimeError(f"deadlock at t={now}: nothing running, not done; "
                               f"{scheduler.describe()}")
        now, _, what, payload = pop(heap)
        items = payload if what == _DONE else (payload,)
        i, n_items = 0, len(items)
        while i < n_items:
            item = items[i]
            i += 1
            if i > 1 and scheduler.done:  # the rest of a batch ends after the run
                break
            if quiet is not None and what == _DONE:
                unit = item[1]
                if type(unit) is quiet[0] and unit.version == quiet[1]:
                    # nothing to assign (see the docstring); with `classes`, the whole run of such
                    # completions at once (complete_parked stops before one that does more than park)
                    j = complete_parked(items, i - 1) if classes else i - 1 + parks(item[0], unit)
                    if j >= i:
                        if not classes:
                            complete(item[0], unit)
                        n_events += j - i + 1
                        kind_name = KINDS[type(unit)]
                        done = items[i - 1:j] if j - i + 1 < n_items else items
                        gone_ = running.pop
                        if not record:
                            for it in done:
                                gone_(it[0])
                        elif kind_name == "sync":  # (its step: the version's optimizer step)
                            spans.extend([Span(wid, "sync", gone_(wid)[0], now, u.version, u.version - 1, None, u)
                                          for wid, u, _ in done])
                        else:
                            spans.extend([Span(wid, kind_name, gone_(wid)[0], now, u.version, u.step, None, u)
                                          for wid, u, _ in done])
                        i = j
                        continue
            n_events += 1
            parked = None  # (kind, version) of a completion that only returned its worker idle
            if what == _DONE:
                wid, unit, token = item
                cur = running.get(wid)
                if cur is None or cur[3] != token:
                    continue  # the worker was lost while running this unit
                t = type(unit)
                if t is WeightSync:
                    if quiet_syncs and (no_events or parks(wid, unit)):
                        parked = (t, unit.version)
                elif t is OptimizerStep and quiet_steps and parks(wid, unit):
                    parked = (t, unit.version)
                del running[wid]
                complete(wid, unit)
                if t is WeightSync:  # most events at scale: the span inline (_version, _step)
                    if record:
                        v = unit.version
                        spans.append(Span(wid, "sync", cur[0], now, v, v - 1, None, unit))
                else:
                    if record:  # kind, _version and _step, inline
                        spans.append(Span(wid, KINDS[t], cur[0], now,
                                          cur[2] if t is Train else None if t is Reward else unit.version,
                                          unit.step, None, unit))
                    if on_version is not None and scheduler.version != version and t is OptimizerStep:
                        version = scheduler.version
                        if on_version(version, now):
                            trace.stopped = True
                            stop = True
                            break
            elif what == _LOST or what == _DEADLINE:
                if what == _DEADLINE:
                    if payload in gone:
                        continue  # it left in time (or was lost before): nothing to take
                    trace.preemption["missed"].append((now, payload))
                gone.add(payload)
                cur = running.pop(payload, None)
                scheduler.worker_lost(payload)
                trace.alive[payload][1] = now
                if cur is not None and record:
                    spans.append(Span(payload, kind(cur[1]), cur[0], now, _version(cur[1], cur[2]),
                                      _step(cur[1]), extra={"lost": True}, unit=cur[1]))
            elif what == _JOIN:
                scheduler.add_worker(payload)
                workers[payload.id] = payload
                trace.workers[payload.id] = payload.role
                trace.alive[payload.id] = [now, None]
            elif payload not in noticed:
                scheduler.drain(payload)
            elif payload not in gone:  # a notice: a refused drain leaves the worker to its deadline
                try:
                    scheduler.drain(payload)
                except SchedulerError:
                    trace.preemption["refused"].append((now, payload))
            for w in scheduler.pop_drained():  # drained workers leave once free
                trace.alive[w.id][1] = now
                gone.add(w.id)
            if max_events is not None and n_events > max_events:
                raise RuntimeError(f"max_events={max_events} exceeded at t={now}")
            quiet = parked if launch() == 0 else None
            if until_synced is not None and scheduler.version >= until_synced and not scheduler.syncing:
                trace.stopped = stop = True
                break
    trace.end = now
    trace.n_events = n_events
    return trace


def _version(unit: Unit, trainer_version: int) -> Optional[int]:
    """The weights a unit ran with: the trainer's for Train, the unit's own otherwise."""
    if type(unit) is Train:
        return trainer_version
    return getattr(unit, "version", None)


def _step(unit: Unit) -> Optional[int]:
    step = getattr(unit, "step", None)
    if step is None:  # WeightSync(v) belongs to the step whose optimizer produced v
        return unit.version - 1
    return step

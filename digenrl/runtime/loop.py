"""The driver's event loop: the scheduler fed by real Ray completions.

    assign() --> backend.dispatch(w, unit) -> ObjectRef[Done]   (an actor method call)
       ^                                            |
       |                                      ray.wait (any)
       |                                            v
       +-- complete(w, unit) + Span(worker-reported start/end) -- info
       +-- worker_lost(w) + add_worker(replacement)          -- RayActorError (of any rank; a
                                                                 rank's failed collective when a
                                                                 peer rank died counts as it)
       +-- poll(loop): join(w) / drain(w) (elastic pools, runtime/elastic.py); drained
           workers that have left are retired (backend.retire stops their actors)
       +-- inputs_lost(w, unit): its micro-batch again       -- ObjectLostError: an input's only
                                                                  copy was on a node that died

Same shape as `digenrl.sim.engine.run_virtual`: the scheduler cannot tell the two apart.
Real compute and emulated compute differ only in the backend (what a unit does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import ray
from ray.exceptions import ObjectLostError, RayActorError, RayTaskError

from digenrl.runtime.results import Done, merge
from digenrl.runtime.waits import WaitTimeout
from digenrl.sched import Scheduler, SchedulerError, Unit, Worker, kind
from digenrl.sched.units import Train, WeightSync
from digenrl.io.trace import Span, Trace


class Backend(Protocol):
    """What a unit does (real models: runtime/backend.py; sleeps: runtime/emulated.py)."""

    def dispatch(self, worker_id: str, unit: Unit) -> list[ray.ObjectRef]:
        """Start `unit` on worker `worker_id`: one result ref per rank of its gang."""

    def completed(self, worker_id: str, unit: Unit, info: Done) -> None:
        """`unit` finished (its ranks' results merged into `info`) and the scheduler took it."""

    def inputs_lost(self, worker_id: str, unit: Unit) -> None:
        """`unit` could not start: an input's only copy was lost; its micro-batch is made again."""

    def replace(self, worker: Worker) -> Worker:
        """A fresh worker for lost `worker` (its actors started); it joins the scheduler."""

    def retire(self, worker: Worker, lost: bool = False) -> None:
        """Stop the actors of `worker`, which left the pools (drained; `lost`: died draining)."""

    def step_done(self, step: int, now: float, trace: Trace) -> None:
        """RL step `step`'s optimizer steps are all in; `trace` holds the units in flight (as
        spans up to `now`) and every span that ended after the previous step_done's `now` (a
        TraceLog keeps no older ones: windows start at a step's end)."""


class EventLoop:
    """Runs `scheduler` to completion on Ray; spans go into `self.trace` (seconds from t0): an
    in-memory Trace, or the `trace` given (a TraceLog: streamed to disk, a window in memory).

    Steps and versions in the trace are the scheduler's (a resumed run counts from the
    checkpoint). `on_dispatch(worker_id, unit)` is a test hook (fault injection).
    `poll(loop)` runs after every batch of events and at least every `poll_s` seconds (it
    may `join` and `drain` workers: elastic pools); `on_leave(worker, lost)` after a drained
    worker has left and its actors are stopped. `stall_s`: a watchdog, raise WaitTimeout (with
    the units in flight and the scheduler's state) when no unit has finished for that long;
    None waits forever (the driver passes runtime.stall_timeout_s).
    """

    def __init__(self, scheduler: Scheduler, backend: Backend, *,
                 on_dispatch: Optional[Callable[[str, Unit], None]] = None,
                 poll: Optional[Callable[["EventLoop"], None]] = None, poll_s: float = 0.5,
                 on_leave: Optional[Callable[[Worker, bool], None]] = None,
                 stall_s: Optional[float] = None, trace: Optional[Trace] = None):
        self.sched, self.backend = scheduler, backend
        self.on_dispatch = on_dispatch
        self.poll, self.poll_s = poll, poll_s
        self.on_leave = on_leave
        self.stall_s = stall_s
        self.trace = Trace() if trace is None else trace
        for w in scheduler.workers:
            self.trace.join(w.id, w.role, 0.0)
        # a unit runs on every rank of its worker's gang: one ref per rank, all in `pending`
        self.pending: dict[ray.ObjectRef, _Call] = {}
        self.t0 = time.time()

    # What BTS learns a unit took: True, what it held its worker for as the driver sees it, from
    # the send to its result back here (the call and its inputs, the work, the result's return),
    # which is what the simulator's durations of a probed plan charge (sim/here.py RuntimeCosts);
    # False, the worker-reported span (emulated compute: its spans are on the modelled clock)
    held_seconds = True

    def now(self) -> float:
        return time.time() - self.t0

    def in_flight(self) -> list[Span]:
        """Units still running, as spans from their dispatch to now (for live bubble ratios)."""
        now = self.now()
        calls = {id(c): c for c in self.pending.values()}.values()
        return [Span(c.wid, kind(c.unit), c.t, now, None, None) for c in calls]

    def live_trace(self) -> Trace:
        """The trace so far with the units in flight as spans up to now (live bubble ratios)."""
        tr = self.trace
        return Trace(spans=tr.spans + self.in_flight(), workers=tr.workers, alive=tr.alive, end=self.now())

    def run(self) -> Trace:
        sched = self.sched
        self._launch()
        last = time.time()  # the latest completion (stall_s)
        while not sched.done:
            if not self.pending:
                raise RuntimeError(f"runtime deadlock: nothing running, not done; {sched.describe()}")
            waiting = self._waiting()
            ready, _ = ray.wait(waiting, num_returns=1,
                                timeout=self.poll_s if self.poll is not None else self.stall_s)
            if ready:
                last = time.time()
            elif self.stall_s is not None and time.time() - last >= self.stall_s:
                raise WaitTimeout(f"runtime stalled: no unit finished for {self.stall_s:g} s "
                                  f"(runtime.stall_timeout_s); running: {self._running()}; {sched.describe()}")
            rest = [r for r in waiting if r not in ready]
            more = ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest and ready else []
            self._take(ready + more)
            if self.poll is not None:
                self.poll(self)
                self._retire()
                self._launch()
        self.trace.finish(self.now())
        return self.trace

    def _running(self) -> str:
        """The units in flight, longest-running first: "worker kind (N s)", at most 8."""
        now = self.now()
        calls = sorted({id(c): c for c in self.pending.values()}.values(), key=lambda c: c.t)
        named = [f"{c.wid} {kind(c.unit)} ({now - c.t:.0f} s)" for c in calls[:8]]
        return ", ".join(named) + (f" and {len(calls) - 8} more" if len(calls) > 8 else "")

    def _waiting(self) -> list:
        """The refs still to wait for: every pending one (a subclass may hold some back)."""
        return list(self.pending)

    def _take(self, refs: list) -> None:
        """Feed a batch of finished units to the scheduler, then launch what it assigns."""
        for ref in refs:
            self._event(ref)
        self._launch()

    def _launch(self) -> None:
        for wid, unit in self.sched.assign():
            if self.on_dispatch is not None:
                self.on_dispatch(wid, unit)
            sent = self.now()  # before the call: the worker may start it before dispatch() returns
            call = _Call(wid, unit, sent, list(self.backend.dispatch(wid, unit)))
            for ref in call.refs:
                self.pending[ref] = call

    def _event(self, ref: ray.ObjectRef) -> None:
        call = self.pending.pop(ref, None)
        if call is None:  # a rank of a gang whose unit was already given up as lost
            return
        wid, unit, t_disp = call.wid, call.unit, call.t
        try:
            call.done[ref] = ray.get(ref)
        except RayActorError as e:  # one rank lost: the unit (and its gang) is lost
            for other in call.refs:
                self.pending.pop(other, None)
            self._lost(wid, unit, t_disp, e, rank=call.refs.index(ref) if len(call.refs) > 1 else None)
            return
        except ObjectLostError as e:  # (RayTaskError too) an input's only copy was on a node that died
            for other in call.refs:
                self.pending.pop(other, None)
            self._inputs_lost(wid, unit, t_disp, e)
            return
        except RayTaskError:
            # a surviving rank of a gang fails its collective when a peer dies (gloo: "connection
            # reset by peer") and can report first: a dead peer makes it a lost unit, not a bug
            dead = _dead_rank(call, ref)
            if dead is None:
                raise
            rank, e = dead
            for other in call.refs:
                self.pending.pop(other, None)
            self._lost(wid, unit, t_disp, e, rank=rank)
            return
        if len(call.done) < len(call.refs):
            return  # other ranks still running
        info = merge([call.done[r] for r in call.refs])
        version_before = self.sched.version
        seconds = info.end - info.start
        if self.held_seconds:  # from the send to its result here (see held_seconds)
            seconds = max(seconds, self.now() - t_disp)
        taken = self.sched.complete(wid, unit, seconds=seconds)  # BTS learns what it took
        self.trace.n_events += 1
        extra = (info.trace_extra() or {}) if taken else {"dropped": True}  # (a new dict per unit)
        extra["sent"] = t_disp  # when the driver sent it: `start` minus this is the dispatch (here_vs_run.py)
        self.trace.add(Span(wid, kind(unit), info.start - self.t0, info.end - self.t0, _version(unit),
                            _step(unit), unit=unit, extra=extra))
        if taken:  # else its micro-batch was regenerated meanwhile (inputs_lost)
            self.backend.completed(wid, unit, info)
        if self.sched.version != version_before:
            now = self.now()
            self.backend.step_done(version_before, now, self.live_trace())
            self.trace.release(now)  # the next step's window starts here

    def _lost(self, wid: str, unit: Unit, t_disp: float, err: Exception, rank: Optional[int] = None) -> None:
        now = self.now()
        self.trace.add(Span(wid, kind(unit), t_disp, now, _version(unit), _step(unit),
                            extra={"lost": True, "error": type(err).__name__}, unit=unit))
        self.trace.leave(wid, now)
        old = next(w for w in self.sched.workers if w.id == wid)
        leaving = wid in self.sched.draining
        try:
            self.sched.worker_lost(wid)
        except SchedulerError as e:
            raise WorkerLostError(wid, old.role, err, rank) from e
        if leaving:  # it was draining: no replacement
            self._left(old, lost=True)
            return
        self.join(self.backend.replace(old))

    # -- membership (elastic pools) ----------------------------------------------------------
    def join(self, worker: Worker) -> None:
        """`worker` (its actors ready) joins the scheduler's pools."""
        self.sched.add_worker(worker)
        self.trace.join(worker.id, worker.role, self.now())

    def drain(self, wid: str) -> None:
        """Worker `wid` takes no new unit and leaves when free (Scheduler.drain; may raise
        SchedulerError). Nothing is sent to it from now on."""
        self.sched.drain(wid)
        self._retire()

    def _retire(self) -> None:
        for w in self.sched.pop_drained():
            self.trace.leave(w.id, self.now())
            self._left(w)

    def _left(self, worker: Worker, lost: bool = False) -> None:
        self.backend.retire(worker, lost=lost)
        if self.on_leave is not None:
            self.on_leave(worker, lost)

    def _inputs_lost(self, wid: str, unit: Unit, t_disp: float, err: Exception) -> None:
        """`unit` could not start: trajectories it reads were only on a node that died. Its
        worker is fine; the scheduler generates the micro-batch again (Scheduler.inputs_lost).
        A WeightSync's input is weights trainer 0 published: its node died, so the run stops
        as for a lost trainer."""
        if type(unit) is WeightSync:
            t0 = next(w for w in self.sched.workers if w.role in ("trainer", "colocated"))
            raise WorkerLostError(t0.id, t0.role, err) from err
        self.trace.add(Span(wid, kind(unit), t_disp, self.now(), _version(unit), _step(unit),
                            extra={"lost": True, "inputs_lost": True, "error": type(err).__name__}, unit=unit))
        self.sched.inputs_lost(wid, unit)
        self.backend.inputs_lost(wid, unit)


class WorkerLostError(RuntimeError):
    """A trainer (or colocated) worker died: gradient and optimizer state are gone."""

    def __init__(self, wid: str, role: str, cause: Exception, rank: Optional[int] = None):
        who = f"{role} worker {wid!r}" if rank is None else f"rank {rank} of {role} gang {wid!r}"
        super().__init__(
            f"{who} died ({type(cause).__name__}); a {role} holds gradient and "
            "optimizer state that cannot be rebuilt mid-run. Rerun the same command with "
            "--resume to continue from the last checkpoint (run.checkpoint_every).")
        self.worker_id = wid


@dataclass
class _Call:
    """One unit in flight on a gang: a result ref per rank, the results so far."""

    wid: str
    unit: Unit
    t: float  # when the driver sent it (loop time, read just before the actor call)
    refs: list
    done: dict = field(default_factory=dict)


def _dead_rank(call: _Call, failed, timeout_s: float = 30.0) -> Optional[tuple[int, RayActorError]]:
    """(rank, error) of a rank of `call`'s gang whose actor died, waiting up to `timeout_s` for
    the other ranks' results after rank `failed` raised; None when none did (or one rank)."""
    others = [r for r in call.refs if r != failed]
    if not others:
        return None
    ready, _ = ray.wait(others, num_returns=len(others), timeout=timeout_s)
    for ref in ready:
        try:
            ray.get(ref)
        except RayActorError as e:
            return call.refs.index(ref), e
        except RayTaskError:
            continue
    return None


def _version(unit: Unit) -> Optional[int]:
    """The weights a unit ran with: the trainer's (= its step) for Train, else the unit's."""
    if type(unit) is Train:
        return unit.step
    return getattr(unit, "version", None)


def _step(unit: Unit) -> int:
    step = getattr(unit, "step", None)
    return unit.version - 1 if step is None else step

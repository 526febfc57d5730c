"""Emulated compute: real Ray actors and messages, workers sleep for the cost model's time.

    config + testbed --sim.workload.duration_fn--> duration_fn(worker, unit) -> modelled seconds
    EmulatedWorker.run(unit, t_ref): sleep until the unit's modelled end (below)

The driver loop is `digenrl.runtime.loop.EventLoop`, the same one real compute uses, so
this measures the runtime (Ray dispatch, the scheduler, the event loop) at 16-32 virtual
GPUs on a laptop. No torch is imported here: 32 actors fit in a few GB. Any picklable
`duration_fn(worker, unit) -> seconds` works (e.g. `digenrl.sim.durations.DurationFn`).
Trace times are divided by `time_scale`, so they read in modelled seconds and compare
directly with `digenrl.sim.engine.run_virtual`. What builds the scheduler and the
durations is elsewhere: `digenrl train runtime.compute=emulated` (the Config's contract on
its testbed's cost model, runtime/driver.py) and `digenrl.tools.bench.emulate_spec` (a simulated
run's spec, measured as the simulator measures it).

Latency. `time_scale` compresses compute, not Ray: a unit's round trip (its enabling
completion travelling back to the driver, the scheduler's decision, the call reaching the
actor, the actor waking up), L wall seconds, would read as L / time_scale modelled seconds:
at time_scale 0.3 on a busy 2-core machine (L ~ 10-20 ms) that alone costs 5-15% of the
small preset's throughput. So each unit is timed on the modelled timeline: t_ref is the
modelled end (wall) of the completion that let the scheduler assign it (the driver's
clock for the first launch and after a loss), L = actual start - t_ref, and the unit ends

    latency="real"    (default) at t_ref + time_scale * (d + L): the round trip counts at
                      its real size, as at time_scale 1 (modelled d + L); the runtime's
                      own overhead, so a fine-grained testbed on a loaded machine shows it
    latency="hidden"  at t_ref + time_scale * d: the round trip is not charged; what is
                      measured is the schedule the runtime makes from real Ray completions
                      (what the simulator, which has no latency, predicts). Here the driver
                      knows every unit's modelled end when it dispatches it, so EmulatedLoop
                      delivers completions in exactly that order and the schedule is the
                      virtual clock's whatever the machine's load (spans: modelled times)
    latency="scaled"  time_scale * d after its actual start: everything counts
                      1 / time_scale-fold (the naive emulation, for comparison)

where d is the modelled duration. Spans are d long and end at that modelled end; a unit
whose round trip exceeds its sleep cannot give the time back, so the wall clock trails
the modelled timeline (span.extra["behind_ms"]; `latency_stats`). While it trails by less
than the gaps between completions, completions still arrive in modelled order; EmulatedLoop
takes each ready batch in modelled order, launching after each completion (as the virtual
clock does). When `behind_ms` nears unit durations, raise time_scale.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Callable, Iterable, Optional

import ray
from ray.exceptions import ActorDiedError

from digenrl.runtime.loop import EventLoop
from digenrl.runtime.preempt import FileNotices, Preemption, TraceNotices, arm_sigterm
from digenrl.runtime.results import Slept
from digenrl.runtime.waits import wait_all
from digenrl.sched import Scheduler, Unit, Worker
from digenrl.sched.preemption import Join
from digenrl.io.trace import Trace

# Deadlines of the waits here (runtime/waits.py): emulated workers ask for no device and load
# no model, so they are up in seconds; a unit sleeps its modelled time x time_scale, and the
# watchdog stops a run in which none finishes for STALL_S wall seconds (pass stall_s for more).
START_S = 120.0
STALL_S = 600.0
LATENCY = ("real", "hidden", "scaled")
PREEMPT_POLL_S = 0.02  # how often a run with spot workers checks notices and deadlines (wall s)


class EmulatedWorker:
    """One virtual GPU: every unit is a sleep of its modelled duration (see module doc)."""

    def __init__(self, worker: Optional[Worker] = None, duration_fn: Optional[Callable] = None,
                 time_scale: float = 1.0, latency: str = "real"):
        self.configure(worker, duration_fn, time_scale, latency)

    def configure(self, worker: Optional[Worker], duration_fn, time_scale: float, latency: str = "real") -> bool:
        """Reuse this actor for another worker / run (actor start-up costs seconds each)."""
        self.worker, self.fn, self.scale, self.latency = worker, duration_fn, time_scale, latency
        return True

    def ready(self) -> bool:
        return True

    def pid(self) -> int:
        """This actor's process (fault injection kills it)."""
        return os.getpid()

    def arm_sigterm(self, directory: str, notice_s: float) -> bool:
        """A spot worker: SIGTERM writes this worker's notice into `directory` (runtime/preempt.py)."""
        arm_sigterm(directory, lambda: self.worker.id, notice_s)
        return True

    def register_node(self, directory: str) -> str:
        """A spot worker: record this worker on its node in `directory`'s registry, where the node's
        metadata watcher finds it (runtime/cloud_notices.py). Returns the node id."""
        import ray

        from digenrl.runtime.cloud_notices import register

        node = ray.get_runtime_context().get_node_id()
        register(directory, node, self.worker.id, ray.util.get_node_ip_address())
        return node

    def run(self, unit: Unit, t_ref: Optional[float] = None, *inputs) -> Slept:
        """`inputs` are refs of the units this one consumes (resolved by Ray: real messages).
        `t_ref`: wall time (modelled timeline) of the completions that enabled this unit."""
        t0 = time.time()
        over = getattr(self.fn, "overhead_ws", None)
        before = dict(over) if over is not None else None
        d = max(0.0, float(self.fn(self.worker, unit)))
        s = self.scale
        ref = t0 if t_ref is None else min(t_ref, t0)
        lat = t0 - ref
        if self.latency == "scaled":
            target = t0 + s * d
        elif self.latency == "hidden":
            target = ref + s * d
        else:
            target = ref + s * (d + lat)
        wait = target - time.time()
        if wait > 0:
            time.sleep(wait)
        end = time.time()
        # The modelled timeline: the span is d long and ends at its target (the naive mode:
        # where the sleep really was); `behind` is how far the wall clock trails it.
        start, stop = (t0, end) if self.latency == "scaled" else (target - s * d, target)
        delta = {}
        if over is not None:
            delta = {k: v - before.get(k, 0.0) for k, v in over.items() if v != before.get(k, 0.0)}
        return Slept(start, stop, latency=lat, behind=max(0.0, end - target), overhead=delta)


class ActorCache:
    """EmulatedWorker actors kept across runs: `bench --emulated` reuses 16-32 of them per mode."""

    def __init__(self, num_cpus: float = 0.0):
        self.num_cpus, self.handles = num_cpus, []

    def get(self, n: int) -> list:
        while len(self.handles) < n:
            self.handles.append(ray.remote(EmulatedWorker).options(
                num_cpus=self.num_cpus, max_restarts=0).remote())
        return self.handles[:n]

    def warm(self, n: int) -> None:
        """Start `n` actors now and wait until they are up (actor start-up costs seconds each)."""
        wait_all({f"emulated worker {i}": h.ready.remote() for i, h in enumerate(self.get(n))},
                 timeout_s=START_S, what="emulated workers starting", key="digenrl.runtime.emulated.START_S")

    def close(self) -> None:
        for h in self.handles:
            ray.kill(h)
        self.handles = []


class EmulatedBackend:
    """EventLoop backend: one EmulatedWorker per scheduler worker (from `cache` if given)."""

    def __init__(self, workers: Iterable[Worker], duration_fn, time_scale: float, num_cpus: float = 0.0,
                 latency: str = "real", cache: Optional[ActorCache] = None):
        if latency not in LATENCY:
            raise ValueError(f"latency={latency!r}: one of {LATENCY}")
        self.fn, self.scale, self.num_cpus, self.latency = duration_fn, time_scale, num_cpus, latency
        self.own = cache is None
        self.cache = cache or ActorCache(num_cpus)
        workers = list(workers)
        self._fn_ref = ray.put(duration_fn)
        self.handles = dict(zip((w.id for w in workers), self.cache.get(len(workers))))
        wait_all({w.id: self.handles[w.id].configure.remote(w, self._fn_ref, time_scale, latency) for w in workers},
                 timeout_s=START_S, what="emulated workers starting", key="digenrl.runtime.emulated.START_S")
        # latency="hidden": the modelled timeline is kept here, in modelled seconds from the
        # first dispatch (the virtual clock's arithmetic: a unit starts at the modelled end of
        # the completion that enabled it and lasts d). `expected`: each call's (modelled end,
        # dispatch order), by which EmulatedLoop delivers completions; `modelled`: each unit's
        # (start, end), by (worker, unit object): one object may go to many workers (a wave:
        # Scheduler.last_waves), each with its own times. The durations come from a copy of duration_fn: its overhead accounting
        # belongs to the actors' copies.
        self.workers = {w.id: w for w in workers}
        self.expected: dict[ray.ObjectRef, tuple[float, int]] = {}
        self.modelled: dict[tuple[str, int], tuple[float, float]] = {}
        self._shadow_fn = copy.deepcopy(duration_fn) if latency == "hidden" else None
        self._seq, self._origin, self._now = 0, None, 0.0
        self.overhead_ws: dict[str, float] = {}
        self._ref: Optional[float] = None  # end of the latest batch of completions
        self._new_batch = True
        self.sigterm: Optional[tuple[str, float]] = None  # spot workers: (notice dir, notice_s), `arm`
        self.spare: dict[str, "ray.actor.ActorHandle"] = {}  # started ahead for a trace's joins (`prestart`)
        self.killed: set[str] = set()  # workers `kill` took, until EmulatedLoop has lost their units
        self.cut: set[tuple[str, int]] = set()  # (worker, unit) lost at a deadline, its `modelled` span ending there

    def arm(self, directory: str, notice_s: float) -> None:
        """Spot rollout workers: SIGTERM to one (a joiner too) writes its notice into `directory`."""
        self.sigterm = (directory, notice_s)
        wait_all({wid: self.handles[wid].arm_sigterm.remote(directory, notice_s)
                  for wid, w in self.workers.items() if w.role == "rollout"},
                 timeout_s=START_S, what="spot workers arming SIGTERM", key="digenrl.runtime.emulated.START_S")

    def _spawn(self, w: Worker) -> None:
        self.workers[w.id] = w
        h = ray.remote(EmulatedWorker).options(num_cpus=self.num_cpus, max_restarts=0).remote(
            w, self._fn_ref, self.scale, self.latency)
        self.cache.handles.append(h)
        self.handles[w.id] = h
        if self.sigterm is not None and w.role == "rollout":
            h.arm_sigterm.remote(*self.sigterm)  # before any unit: an actor runs calls in order

    def _drop(self, wid: str) -> None:
        """Take a dead actor out of the cache (a later run must not be handed it)."""
        dead = self.handles.pop(wid, None)
        self.cache.handles = [h for h in self.cache.handles if h is not dead]

    def dispatch(self, wid: str, unit: Unit) -> list[ray.ObjectRef]:
        self._new_batch = True
        if self._shadow_fn is None:
            return [self.handles[wid].run.remote(unit, self._ref if self._ref is not None else time.time())]
        # hidden: the actor sleeps until origin + time_scale * (its modelled end)
        if self._origin is None:
            self._origin = time.time()
        d = max(0.0, float(self._shadow_fn(self.workers[wid], unit)))
        ref = self.handles[wid].run.remote(unit, self._origin + self.scale * self._now)
        self.expected[ref] = (self._now + d, self._seq)
        self.modelled[wid, id(unit)] = (self._now, self._now + d)
        self._seq += 1
        return [ref]

    def completed(self, wid: str, unit: Unit, info: Slept) -> None:
        # EventLoop: completions of one batch, then the dispatches they enabled.
        self._ref = info.end if self._new_batch or self._ref is None else max(self._ref, info.end)
        if (wid, id(unit)) in self.modelled:  # hidden: delivered in modelled order, one at a time
            self._now = self.modelled[wid, id(unit)][1]
        self._new_batch = False
        for k, v in info.overhead.items():
            self.overhead_ws[k] = self.overhead_ws.get(k, 0.0) + v

    def replace(self, worker: Worker) -> Worker:
        new = Worker(worker.id + "'", worker.role)
        self._drop(worker.id)
        self._spawn(new)
        self._ref = None  # after a loss: time from the dispatch
        return new

    def kill(self, wid: str) -> None:
        """A spot worker past its deadline: its actor dies now (its unit in flight is lost)."""
        h = self.handles.get(wid)
        if h is not None:
            self.killed.add(wid)
            ray.kill(h, no_restart=True)

    def add(self, join: Join, loop: EventLoop) -> None:
        """A spot replacement arrives and joins at once: its actor started ahead (`prestart`),
        else a fresh one (its first unit, a WeightSync, then waits in Ray's queue until the
        actor is up, and that start-up counts as modelled time)."""
        w = Worker(join.worker, "rollout")
        h = self.spare.pop(w.id, None)
        if h is None:
            self._spawn(w)
        else:
            self.workers[w.id], self.handles[w.id] = w, h
        loop.join(w)

    def prestart(self, worker_ids: Iterable[str]) -> None:
        """Start the actors of rollout workers that will join later (a trace's joins), so that
        each is up when it joins: a provider's replacement arrives ready, as the simulator has it."""
        for wid in worker_ids:
            w = Worker(wid, "rollout")
            h = ray.remote(EmulatedWorker).options(num_cpus=self.num_cpus, max_restarts=0).remote(
                w, self._fn_ref, self.scale, self.latency)
            if self.sigterm is not None:
                h.arm_sigterm.remote(*self.sigterm)
            self.cache.handles.append(h)
            self.spare[wid] = h
        wait_all({wid: h.ready.remote() for wid, h in self.spare.items()}, timeout_s=START_S,
                 what="spot replacements starting", key="digenrl.runtime.emulated.START_S")

    def retire(self, worker: Worker, lost: bool = False) -> None:
        """A drained worker left: its actor is not reused (it may still be finishing a call)."""
        h = self.handles.get(worker.id)
        self._drop(worker.id)
        if h is not None:
            ray.kill(h)

    def inputs_lost(self, wid: str, unit: Unit) -> None:
        pass  # emulated units pass no data: nothing to forget

    def step_done(self, step: int, now: float, trace: Trace) -> None:
        pass

    def close(self) -> None:
        if self.own:
            self.cache.close()


class EmulatedLoop(EventLoop):
    """EventLoop that takes each batch of ready completions in modelled order, one at a time,
    launching after each (as `digenrl.sim.engine.run_virtual` does). The plain loop completes
    a whole batch, then launches: when time is compressed, completions modelled tens of ms
    apart arrive together, and everything they enable would start at the batch's latest end.

    With latency="hidden" every call's modelled end is known when it is dispatched
    (`EmulatedBackend.expected`), so the order is exact: a finished call is held back until
    no call still running ends earlier in modelled time (ties: dispatch order, as the virtual
    clock breaks them). The schedule then depends on the modelled durations only, not on how
    late a loaded machine delivers a completion: the emulated run makes the simulator's
    decisions in the simulator's order.

    `wake()`: the next modelled time at which `poll` has something to do (a spot notice, a
    deadline, a join: Preemption.next_at), or None. With latency="hidden", before a completion
    that ends at or after it is delivered, the modelled clock is set to that time and `poll`
    runs there, as the simulator's event at that time would (its timed events come before
    completions at the same time). The unit of a worker it kills (`EmulatedBackend.kill`) is
    lost there and then, before anything is launched: its micro-batch is regenerated at the
    deadline, as in the simulator, not at the modelled end of the unit it cut.
    """

    held_seconds = False  # BTS learns the modelled spans, as the simulator does

    def __init__(self, scheduler: Scheduler, backend: "EmulatedBackend", *,
                 wake: Optional[Callable[[], Optional[float]]] = None, **kwargs):
        super().__init__(scheduler, backend, **kwargs)
        self.held: set = set()  # finished refs waiting for an earlier one (latency="hidden")
        self.wake = wake

    def _waiting(self) -> list:
        return [r for r in self.pending if r not in self.held]

    def _take(self, refs: list) -> None:
        expected = self.backend.expected
        if not expected:
            for ref in sorted(refs, key=_modelled_end):
                self._event(ref)
                self._launch()
            return
        self.held.update(refs)
        unknown = (float("-inf"), -1)  # a call with no modelled end is delivered first
        while self.held:
            first = min(self.held, key=lambda r: expected.get(r, unknown))
            end = expected.get(first, unknown)
            running = [expected[r] for r in self.pending if r not in self.held and r in expected]
            if running and min(running) < end:
                return  # a call still running ends earlier: wait for it
            if self._woken(end[0]):
                continue  # the poll may have killed a worker: its loss comes first now
            self.held.discard(first)
            expected.pop(first, None)
            self._event(first)
            self._launch()

    def _woken(self, end: float) -> bool:
        """Run `poll` at the wake-up time if it comes no later than `end` (the next completion's
        modelled end); then lose the units of the workers it killed, and launch, as the simulator
        does after a deadline. True if it ran."""
        at = self.wake() if self.wake is not None and self.poll is not None else None
        if at is None or at > end:
            return False
        b = self.backend
        b._now = max(b._now, at)
        self.poll(self)
        for wid in list(b.killed):
            b.killed.discard(wid)
            # In modelled time the unit ends after the deadline (everything ending earlier was
            # delivered first), so it is lost here, whether or not the actor, killed a few wall
            # ms before its sleep ends, has already returned: that race is the machine's, not
            # the model's.
            for call in {id(c): c for c in self.pending.values() if c.wid == wid}.values():
                for ref in call.refs:
                    self.pending.pop(ref, None)
                    self.held.discard(ref)
                    b.expected.pop(ref, None)
                start = b.modelled.get((wid, id(call.unit)), (b._now, b._now))[0]
                b.modelled[wid, id(call.unit)] = (start, b._now)  # its span: dispatch to deadline
                b.cut.add((wid, id(call.unit)))
                self._lost(wid, call.unit, call.t, ActorDiedError())
        self._retire()
        self._launch()
        return self.wake() != at  # nothing consumed (cannot happen): deliver, do not spin


def _modelled_end(ref) -> float:
    try:
        return ray.get(ref).end
    except Exception:  # a lost worker: handled first (EventLoop._event)
        return float("-inf")


def run_scheduler_emulated(sched: Scheduler, duration_fn, time_scale: float = 1.0, *, latency: str = "real",
                           cache: Optional[ActorCache] = None, stall_s: float = STALL_S,
                           preemption: Optional[Preemption] = None) -> Trace:
    """Drive `sched` with EmulatedWorker actors (Ray must be initialised); modelled-seconds Trace.
    `stall_s`: the event loop's watchdog (wall seconds without a unit finishing).

    `preemption`: spot rollout workers (runtime/preempt.py), its notices on the modelled
    clock; its kill and add (when None) are this backend's, and its stats and log are
    filled in as the run goes. The actors of a trace's joins are started before the run
    (`EmulatedBackend.prestart`), so a replacement's start-up is not charged as modelled time.
    With latency="hidden" the loop polls at each notice, join and deadline on the modelled clock
    (EmulatedLoop's `wake`: Preemption.next_at), as the simulator does; otherwise it polls every
    PREEMPT_POLL_S wall seconds, so a deadline is met within PREEMPT_POLL_S / time_scale
    modelled seconds.

    Baseline overheads the actors' copies of a DurationFn paid are added to
    `duration_fn.overhead_ws` (as a simulated run would have them).
    """
    backend = EmulatedBackend(sched.workers, duration_fn, time_scale, latency=latency, cache=cache)
    extra = {}
    if preemption is not None:
        if preemption.clock is None:  # the modelled clock: the virtual one when round trips are hidden
            preemption.clock = ((lambda loop: backend._now) if latency == "hidden"
                                else (lambda loop: loop.now() / time_scale))
        preemption.kill = preemption.kill or backend.kill
        preemption.add = preemption.add or backend.add
        for src in preemption.sources:
            if isinstance(src, FileNotices):  # SIGTERM writes there
                backend.arm(str(src.dir), src.default_s)
        if preemption.add == backend.add:  # a trace's replacements: up before they join
            backend.prestart(e.worker for src in preemption.sources if isinstance(src, TraceNotices)
                             for e in src.events if isinstance(e, Join))
        extra = dict(poll=preemption.poll, poll_s=PREEMPT_POLL_S,
                     wake=preemption.next_at if latency == "hidden" else None)
    try:
        loop = EmulatedLoop(sched, backend, stall_s=stall_s, **extra)
        trace = loop.run()
        if preemption is not None:
            preemption.finish(loop)
    finally:
        backend.close()
    over = getattr(duration_fn, "overhead_ws", None)
    if isinstance(over, dict):
        for k, v in backend.overhead_ws.items():
            over[k] = over.get(k, 0.0) + v
    for s in trace.spans:  # (latency_ms, behind_ms: Slept.trace_extra, as each span was made)
        lost = (s.extra or {}).get("lost") and (s.worker, id(s.unit)) not in backend.cut
        modelled = backend.modelled.get((s.worker, id(s.unit))) if s.unit is not None and not lost else None
        s.start, s.end = modelled or (s.start / time_scale, s.end / time_scale)
    trace.end = trace.end / time_scale if latency == "scaled" else max((s.end for s in trace.spans), default=0.0)
    trace.alive = {w: [a / time_scale, None if b is None else b / time_scale] for w, (a, b) in trace.alive.items()}
    return trace


def latency_stats(trace: Trace) -> dict:
    """Round trip per unit (wall ms, see module doc) over an emulated trace."""
    lat = sorted(s.extra["latency_ms"] for s in trace.spans if s.extra and "latency_ms" in s.extra)
    behind = sorted(s.extra["behind_ms"] for s in trace.spans if s.extra and "behind_ms" in s.extra)
    if not lat:
        return {}
    q = lambda v, f: v[int(f * (len(v) - 1))]  # noqa: E731
    return {"units": len(lat), "latency_ms_median": q(lat, 0.5), "latency_ms_p90": q(lat, 0.9),
            "latency_ms_max": lat[-1], "behind_ms_median": q(behind, 0.5), "behind_ms_p90": q(behind, 0.9),
            "behind_ms_max": behind[-1]}

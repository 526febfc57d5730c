"""Emulated compute: real Ray actors and messages, workers sleep for the cost model's time.

    testbed --make_duration_fn(mode)--> duration_fn(worker, unit) -> modelled seconds
    EmulatedWorker.run(unit): sleep(duration_fn(worker, unit) * time_scale)

The driver loop is `digenrl.runtime.loop.EventLoop`, the same one real compute uses, so
this measures the runtime (Ray dispatch, the scheduler, the event loop) at 16-32 virtual
GPUs on a laptop. No torch is imported here: 32 actors fit in a few GB. Any picklable
`duration_fn(worker, unit) -> seconds` works (e.g. `digenrl.sim.durations.DurationFn`).
Trace times are divided by `time_scale`, so they read in modelled seconds and compare
directly with `digenrl.sim.engine.run_virtual`.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Optional

import ray

from digenrl.runtime.loop import EventLoop
from digenrl.sched import Scheduler, Unit, Worker
from digenrl.trace import Trace


class EmulatedWorker:
    """One virtual GPU: every unit is a sleep of its modelled duration."""

    def __init__(self, worker: Worker, duration_fn: Callable[[Worker, Unit], float], time_scale: float):
        self.worker, self.fn, self.scale = worker, duration_fn, time_scale

    def ready(self) -> bool:
        return True

    def run(self, unit: Unit, *inputs) -> dict:
        """`inputs` are refs of the units this one consumes (resolved by Ray: real messages)."""
        t0 = time.time()
        time.sleep(max(0.0, self.fn(self.worker, unit)) * self.scale)
        return {"start": t0, "end": time.time()}


class EmulatedBackend:
    def __init__(self, workers: Iterable[Worker], duration_fn, time_scale: float, num_cpus: float = 0.0):
        self.fn, self.scale, self.num_cpus = duration_fn, time_scale, num_cpus
        self.handles = {}
        for w in workers:
            self._spawn(w)
        ray.get([h.ready.remote() for h in self.handles.values()])

    def _spawn(self, w: Worker) -> None:
        self.handles[w.id] = ray.remote(EmulatedWorker).options(
            num_cpus=self.num_cpus, max_restarts=0).remote(w, self.fn, self.scale)

    def dispatch(self, wid: str, unit: Unit) -> ray.ObjectRef:
        return self.handles[wid].run.remote(unit)

    def completed(self, wid: str, unit: Unit, info: dict) -> None:
        pass

    def replace(self, worker: Worker) -> Worker:
        new = Worker(worker.id + "'", worker.role)
        self._spawn(new)
        return new

    def step_done(self, step: int, now: float) -> None:
        pass

    def close(self) -> None:
        for h in self.handles.values():
            ray.kill(h)


def run_scheduler_emulated(sched: Scheduler, duration_fn, time_scale: float = 1.0) -> Trace:
    """Drive `sched` with EmulatedWorker actors (Ray must be initialised); modelled-seconds Trace."""
    backend = EmulatedBackend(sched.workers, duration_fn, time_scale)
    try:
        trace = EventLoop(sched, backend).run()
    finally:
        backend.close()
    for s in trace.spans:
        s.start, s.end = s.start / time_scale, s.end / time_scale
    trace.end /= time_scale
    trace.alive = {w: [a / time_scale, None if b is None else b / time_scale] for w, (a, b) in trace.alive.items()}
    return trace


def run_emulated(testbed, mode: str, steps: int = 3, time_scale: float = 0.01,
                 gpus: Optional[int] = None, spec=None) -> Trace:
    """`digenrl bench --emulated`: a testbed (preset name, path or Testbed) in `mode` on Ray.

    Starts a local Ray cluster if none is up (and shuts it down after). `gpus` resizes the
    testbed (e.g. 4 for a quick check); `spec` is a `digenrl.sim.report.RunSpec` (knobs).
    """
    from digenrl.sim.durations import make_duration_fn
    from digenrl.sim.report import RunSpec, default_cost_model, resize, sched_config
    from digenrl.sim.testbed import Testbed, load_testbed

    tb = testbed if isinstance(testbed, Testbed) else load_testbed(testbed)
    if gpus is not None:
        tb = resize(tb, gpus)
    spec = spec or RunSpec(mode=mode)
    fn = make_duration_fn(tb, default_cost_model(), mode, n_rollout=spec.n_rollout, style=spec.style,
                          samples_per_group=spec.samples_per_group, zero_baseline=spec.zero_baseline)
    sched = Scheduler(sched_config(tb, spec, steps), fn.layout.workers)
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        return run_scheduler_emulated(sched, fn, time_scale)
    finally:
        if started:
            ray.shutdown()


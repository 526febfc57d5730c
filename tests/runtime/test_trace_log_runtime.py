"""The event loop streams its trace (io/trace.py TraceLog) and hands step_done a window of it:
the bubble ratios a backend computes there are the whole trace's, and the file ends with
every span. tests/io/test_trace_log.py checks the same on a replayed simulated run."""

from digenrl.io.trace import Trace, TraceLog, bubble_ratio, read_trace
from digenrl.runtime.emulated import EmulatedBackend, EmulatedLoop
from digenrl.sched import SchedConfig, Scheduler, Worker, kind

SECONDS = {"generate": 1.0, "reward": 0.2, "train": 0.3, "optimizer": 0.3, "sync": 0.2}
POOLS = ("rollout", "trainer")


def _fixed(worker, unit):
    steps = unit.t_end - unit.t_start if kind(unit) == "generate" else 1
    return SECONDS[kind(unit)] * steps


class _Recording(EmulatedBackend):
    """At each step end: the per-pool bubble ratios over [previous step end, now] from the
    window the loop passes, and from the whole trace so far (trace.jsonl is flushed per line,
    so reading it now gives every span yet) plus the same units in flight."""

    def __init__(self, workers, path):
        super().__init__(workers, _fixed, time_scale=0.02)
        self.path, self.rows, self.last_end = path, [], 0.0

    def step_done(self, step, now, trace):
        flying = [s for s in trace.spans if s.step is None]  # live_trace's units in flight carry no step
        so_far = read_trace(self.path)
        whole = Trace(so_far.spans + flying, trace.workers, trace.alive, trace.end)
        self.rows.append((step, len(trace.spans) - len(flying), len(so_far.spans),
                          [bubble_ratio(trace, p, self.last_end, now) for p in POOLS],
                          [bubble_ratio(whole, p, self.last_end, now) for p in POOLS]))
        self.last_end = now


def test_step_window_bubbles_equal_the_whole_trace(ray_cluster, tmp_path):
    workers = [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")]
    sched = Scheduler(SchedConfig(mode="digenrl", rl_steps=4, groups_per_step=4, samples_per_group=2, num_steps=2),
                      workers)
    backend = _Recording(workers, tmp_path / "trace.jsonl")
    with TraceLog(tmp_path / "trace.jsonl") as log:
        try:
            EmulatedLoop(sched, backend, trace=log).run()
        finally:
            backend.close()
    assert [r[0] for r in backend.rows] == [0, 1, 2, 3]
    for step, window, so_far, streamed, whole in backend.rows:
        assert streamed == whole, step
        assert window < so_far or step == 0  # the window holds the step's spans, not the run's
    back = read_trace(tmp_path / "trace.jsonl")
    assert back.n_events == log.n_events == len(back.spans) and back.end == log.end
    assert len(log.spans) < len(back.spans)

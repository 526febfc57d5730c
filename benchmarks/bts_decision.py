"""BTS's decision time per trainer bubble at 64 GPUs (issue 38: at most 10 ms on a 2-core CPU).

Simulates the digenrl row (GAP + TSP + TAG + BTS) of a 64-GPU testbed with the planner's knobs
and times every `Scheduler._bts_insert` call (the prediction and its recursive search), then
prints the count, median, 95th percentile and max in ms, of all calls and of the calls that ran
the search (a bubble asked again with nothing changed returns its choice, sched/scheduler.py),
and how many searched bubbles inserted TAG.

    PYTHONPATH=. python benchmarks/bts_decision.py [--testbed tests/sim/testbeds/qwen-full-h100x64.yaml]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from digenrl.sched.scheduler import Scheduler
from digenrl.sim.planner import plan
from digenrl.sim.report import run_spec
from digenrl.sim.testbed import load_testbed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--testbed", default="tests/sim/testbeds/qwen-full-h100x64.yaml")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    tb = load_testbed(args.testbed)
    # TAG's best knobs with a rollout pool (a plan without one has no bubble to weigh), then BTS
    spec = plan(tb, mode="gap+tsp+tag", steps=4).spec
    if not spec.n_rollout:
        spec = replace(spec, n_rollout=tb.n_gpus // 4)
    spec = replace(spec, mode="digenrl", micro_batch_groups=1)
    times: list[float] = []
    searched: list[float] = []  # the calls that ran the search (not a bubble's repeated ask)
    inserted: list[bool] = []
    inner = Scheduler._bts_insert

    def timed(self, *a, **kw):
        n = len(self.decisions)
        t0 = time.perf_counter()
        out = inner(self, *a, **kw)
        times.append(time.perf_counter() - t0)
        if len(self.decisions) > n:
            searched.append(times[-1])
            inserted.append(out)
        return out

    Scheduler._bts_insert = timed
    try:
        r = run_spec(tb, spec, args.steps, keep_trace=True)
    finally:
        Scheduler._bts_insert = inner
    print(f"{tb.name}: {tb.n_gpus} GPUs, {spec.knobs()}")
    if not times:
        print("no bubble reached BTS")
        return
    for what, xs in (("calls", times), ("searches", searched)):
        ms = sorted(t * 1e3 for t in xs)
        if ms:
            print(f"{len(ms)} {what}: median {statistics.median(ms):.2f} ms, p95 {ms[int(0.95 * (len(ms) - 1))]:.2f} ms, "
                  f"max {ms[-1]:.2f} ms")
    print(f"step {r.step_s:.1f} s; InsertTAG at {sum(inserted)} of {len(inserted)} searched bubbles")


if __name__ == "__main__":
    main()

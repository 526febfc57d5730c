"""The simulator at cluster scale with the cost model: 4,096 GPUs x 100 RL steps.

    python benchmarks/sim_scale.py [--preset h200x32-flux] [--gpus 4096] [--steps 100] [--mode digenrl]

benchmarks/sched_scale.py times the scheduler with constant costs; this one drives it with
the real duration function (digenrl.sim.durations) on a paper preset resized to --gpus,
with one prompt group per rollout GPU per step and the analytic rollout/trainer split.
Prints wall seconds and events/s (target: < 60 s on one core).
"""

from __future__ import annotations

import argparse
import time

from digenrl.config.contract import contract
from digenrl.sched import Scheduler
from digenrl.sim.costs import default_cost_model
from digenrl.sim.engine import run_virtual
from digenrl.sim.planner import analytic_split
from digenrl.sim.workload import RunSpec
from digenrl.sim.testbed import load_testbed, resize
from digenrl.sim.workload import config_for, duration_fn


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="h200x32-flux")
    p.add_argument("--gpus", type=int, default=4096)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--mode", default="digenrl")
    a = p.parse_args(argv)
    cm = default_cost_model()
    tb = resize(load_testbed(a.preset), a.gpus)
    r = analytic_split(tb, cm)
    tb = resize(load_testbed(a.preset, groups_per_step=r), a.gpus)  # one group per rollout GPU
    spec = RunSpec(a.mode, n_rollout=None if a.mode == "colocated" else r, tsp_chunk=3, tag_segment=4)
    t0 = time.perf_counter()
    cfg = config_for(tb, spec, a.steps)
    run = contract(cfg)
    fn = duration_fn(cfg, tb, cm, run)
    s = Scheduler(run.sched, run.workers())
    tr = run_virtual(s, fn, record=False)
    wall = time.perf_counter() - t0
    print(f"preset={a.preset} gpus={a.gpus} rollout={r} mode={a.mode} rl_steps={a.steps} "
          f"groups/step={tb.groups_per_step} events={tr.n_events:,} virtual={tr.end / a.steps:.1f} s/step "
          f"wall={wall:.1f} s events/s={tr.n_events / wall:,.0f} handovers={s.stats['handovers']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

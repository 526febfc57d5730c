"""Simulation time against cluster size, with run_virtual's class reduction and without.

    python benchmarks/sim_scale_curve.py [--testbed FILE|PRESET] [--gpus 16,64,...,65536]
                                         [--unreduced-max 16384] [--repeat 3] [--png curve.png]

One simulated run per size (the unit the planner repeats for every point it tries): the testbed
resized to N GPUs, the digenrl mode at the analytic rollout/trainer split (planner.analytic_split)
rounded to whole nodes, the smallest trainer gang that holds the training state, 12 RL steps, the
trace kept (as report.run_spec keeps it). Each run is timed with run_virtual's class reduction (the default) and,
up to --unreduced-max GPUs, without it (quiet_syncs, batched and classes off: the reference
engine); the two traces are compared span for span and the script fails if they differ. The
batch (groups per step) stays the testbed's, so a larger cluster adds idle rollout workers and
trainer gangs: identical workers. Prints one line per size: GPUs, workers, events, CPU seconds of
run_virtual (time.process_time, best of --repeat: a shared machine's load moves wall time far
more than CPU time), the ratio.
"""

from __future__ import annotations

import argparse
import sys
import time


def _run(tb, spec, steps, cm, **flags):
    from digenrl.sched import Scheduler
    from digenrl.sim.engine import run_virtual
    from digenrl.sim.report import spec_duration_fn

    _, run, fn = spec_duration_fn(tb, spec, steps, cm)
    sched = Scheduler(run.sched, fn.layout.workers)
    t = time.process_time()
    trace = run_virtual(sched, fn, **flags)
    return time.process_time() - t, trace, fn


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--testbed", default="tests/sim/testbeds/qwen-full-h100x64.yaml")
    p.add_argument("--gpus", default="16,64,256,1024,4096,16384,65536")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3, help="runs per size and engine; the best is printed")
    p.add_argument("--unreduced-max", type=int, default=16384, help="largest size also run unreduced")
    p.add_argument("--png", help="also plot the curve here (matplotlib)")
    a = p.parse_args(argv)

    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.planner import analytic_split
    from digenrl.sim.testbed import load_testbed, resize
    from digenrl.sim.workload import RunSpec

    cm = default_cost_model()
    base = load_testbed(a.testbed)
    rows = []
    print(f"{base.name}: digenrl at the analytic split, {a.steps} RL steps, best of {a.repeat}")
    print(f"{'GPUs':>7} {'rollout':>8} {'trainers':>8} {'events':>9} {'reduced s':>10} {'unreduced s':>12} {'ratio':>6}")
    for n in [int(x) for x in a.gpus.split(",")]:
        tb = resize(base, n)
        gpn = tb.pools[0].gpus_per_node  # whole nodes each side: trainer gangs of a node, not one odd gang
        spec = RunSpec("digenrl", n_rollout=min(n - gpn, max(gpn, round(analytic_split(tb, cm) / gpn) * gpn))
                       if n > gpn else None)  # at least a node each side
        fast, trace, fn = min((_run(tb, spec, a.steps, cm) for _ in range(a.repeat)), key=lambda r: r[0])
        slow = None
        if n <= a.unreduced_max:
            slow, ref, _ = min((_run(tb, spec, a.steps, cm, quiet_syncs=False, batched=False, classes=False)
                                for _ in range(a.repeat)), key=lambda r: r[0])
            if ref.spans != trace.spans or ref.end != trace.end:
                print(f"{n}: the reduced trace differs from the unreduced one", file=sys.stderr)
                return 1
        roles = [w.role for w in fn.layout.workers]
        r, t = roles.count("rollout"), roles.count("trainer")
        rows.append((n, fast, slow))
        print(f"{n:7d} {r:8d} {t:8d} {trace.n_events:9d} {fast:10.3f} "
              + (f"{slow:12.3f} {slow / fast:6.1f}" if slow is not None else f"{'-':>12} {'-':>6}"), flush=True)
    if a.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([x[0] for x in rows], [x[1] for x in rows], "o-", label="reduced (run_virtual classes=True)")
        un = [x for x in rows if x[2] is not None]
        ax.plot([x[0] for x in un], [x[2] for x in un], "s--", label="unreduced (every fast path off)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs")
        ax.set_ylabel(f"CPU seconds per simulated run ({a.steps} RL steps)")
        ax.set_title(base.name)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.png, dpi=120)
        print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

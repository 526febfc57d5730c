"""The same preemption trace through the simulator and the emulated runtime, side by side.

    python benchmarks/spot_emulated_vs_sim.py [--testbed small-h200x16-sd35] [--gpus 8] [--mode gap]
                                              [--steps 12] [--seeds 0 1 2] [--per-hour 600] [--notice-s 1]
                                              [--replace-s 2] [--time-scale 0.05]

For each seed: plans `mode` on the testbed, draws one trace (sched.preemption.draw over the
planned rollout workers, horizon twice the on-demand simulated run), and runs it
  - in the simulator (sim.spot.run_spot with the trace's events: drains at notices, losses at
    deadlines, joins, on the virtual clock), and
  - on the emulated runtime (runtime.emulated.run_scheduler_emulated with a Preemption of the
    same events; Ray round trips hidden, so units complete in modelled order, and the loop
    polls at each notice, join and deadline on the modelled clock),
each measured as sim.spot measures a preempted run: trained samples over the steady window's
wall time (report.steady_window). Prints one line per seed:
throughput of each, their ratio, and notices / drained / missed deadlines of each. Starts a
local Ray cluster of its own.
"""

from __future__ import annotations

import argparse

from digenrl.sched.preemption import Notice, SpotSpec, draw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testbed", default="small-h200x16-sd35")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--mode", default="gap")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--per-hour", type=float, default=600.0, help="reclaims per worker-hour (modelled)")
    ap.add_argument("--notice-s", type=float, default=1.0)
    ap.add_argument("--replace-s", type=float, default=2.0)
    ap.add_argument("--time-scale", type=float, default=0.05, help="wall seconds per modelled second")
    a = ap.parse_args()

    import ray

    from digenrl.runtime.emulated import run_scheduler_emulated
    from digenrl.runtime.preempt import Preemption, TraceNotices
    from digenrl.sched import Scheduler
    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.engine import run_virtual
    from digenrl.sim.planner import plan
    from digenrl.sim.report import spec_duration_fn, steady_window
    from digenrl.sim.spot import run_spot
    from digenrl.sim.testbed import load_testbed, resize

    cm = default_cost_model()
    tb = resize(load_testbed(a.testbed), a.gpus)
    spec = plan(tb, mode=a.mode, steps=a.steps, cm=cm).spec
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"{tb.name}, {a.mode}, {a.steps} RL steps, {a.per_hour:g} reclaims/worker-h, notice {a.notice_s} s, "
          f"replacement after {a.replace_s} s; time scale {a.time_scale}")
    print(f"{'seed':>4} {'sim smp/s':>10} {'emu smp/s':>10} {'emu/sim':>8}   sim notices/drained/missed   "
          f"emu notices/honoured/killed")
    try:
        for seed in a.seeds:
            cfg, run, fn = spec_duration_fn(tb, spec, a.steps, cm)
            rollout = [w.id for w in fn.layout.workers if w.role == "rollout"]
            horizon = 2.0 * run_virtual(Scheduler(run.sched, fn.layout.workers), fn).end
            events = draw(SpotSpec(1.0, a.per_hour, a.notice_s, a.replace_s), rollout, horizon, seed)
            sim = run_spot(tb, spec, a.steps, cm, events=events)
            cfg, run, fn = spec_duration_fn(tb, spec, a.steps, cm)
            pre = Preemption(sources=[TraceNotices(events)])
            trace = run_scheduler_emulated(Scheduler(run.sched, run.workers()), fn, a.time_scale, latency="hidden",
                                           preemption=pre)
            t0, t1, n = steady_window(trace, a.steps)
            emu_thr = tb.samples_per_step * n / (t1 - t0)
            st = pre.stats
            print(f"{seed:>4} {sim.throughput:10.3f} {emu_thr:10.3f} {emu_thr / sim.throughput:8.3f}   "
                  f"{sim.notices:>7} / {sim.drained:>3} / {sim.deadlines_missed:<3}              "
                  f"{st['notices']:>7} / {st['honoured']:>3} / {st['killed']:<3}"
                  f"   (drawn: {sum(isinstance(e, Notice) for e in events)} notices)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

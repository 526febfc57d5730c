"""Modes side by side in one run: `digenrl bench --real` (tiny model) or `--emulated` (testbed).

    digenrl bench --real [--config FILE] [--modes gap,digenrl] [--plans never,auto] [--steps 3] [--out DIR]
                  [key=value ...]
    digenrl bench --emulated --testbed h200x16-flux [--gpus 4] [--time-scale S | --run-s 10]
                  [--latency real|hidden|scaled] [--modes ...] [--steps 12] [--out DIR]

Real: every mode runs the same config (pools from runtime.*) for `--steps` RL steps on
one Ray cluster, once per `--plans` value of runtime.plan (never: the config's pools and
knobs as given; auto/always: planned on this machine, digenrl.sim.here); throughput is trained samples per wall second over the steps after the
first (warm-up), bubble ratios are means over those steps; prints a table, writes
`bench.json` and `bench.png` (samples/s per mode) under --out. Emulated: every row of
`digenrl simulate` (same planner knobs, steps and steady-state window) on the runtime with
sleeping workers, in modelled seconds: prints simulate's table for the emulated runs, then
emulated vs simulated samples/s per row (and Ray round-trip latency); writes `bench.json`.

This module sits above both `digenrl.runtime` and `digenrl.sim` (it compares them); the
runtime never imports the simulator's reports, and this module never imports Ray itself.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from digenrl.config.errors import ConfigError
from digenrl.config.run import MODES as RUN_MODES
from digenrl.config.runtime import PLAN
from digenrl.config.schema import Config, load_config

MODES = tuple(m for m in RUN_MODES if m != "local")


def bench_real(cfg: Config, modes: Sequence[str] = MODES, steps: int = 3,
               out: Optional[str] = None, plans: Sequence[Optional[str]] = (None,)) -> list[dict]:
    """Run each mode (x each runtime.plan value in `plans`; None = the config's) for `steps`
    RL steps on the tiny model; returns one row per run."""
    from digenrl.io.outputs import read_metrics
    from digenrl.runtime.cluster import session
    from digenrl.runtime.driver import RayDriver
    from digenrl.train.trainer import Trainer

    root = Path(out or Path(cfg.run.run_dir) / "bench")
    rt = cfg.runtime
    rows = []
    with session(rt.address, [(rt.rollout, rt.rollout.workers), (rt.trainer, rt.trainer.workers),
                              (rt.reward, rt.reward.workers)]):
        for mode, plan in [(m, p) for m in modes for p in plans]:
            if mode not in RUN_MODES:
                raise ValueError(f"--modes: {mode!r} is not one of {', '.join(RUN_MODES)}")
            c = copy.deepcopy(cfg)
            label = mode if plan is None or mode == "local" else f"{mode} [plan {plan}]"
            c.run.mode, c.train.steps = mode, steps
            c.run.run_dir = str(root / label.replace("+", "_").replace(" [plan ", "-").rstrip("]"))
            c.run.loggers, c.run.checkpoint_every = [], 0  # metrics.jsonl only
            if plan is not None:
                c.runtime.plan = plan
            summary = {}
            if mode != "local":  # run.threads is the local process's; Ray workers take runtime.worker_threads
                c.run.threads = 0
            if mode == "local":
                Trainer(c, progress=False).train()
            else:
                summary = RayDriver(c, progress=False, evaluate=False).train()
            rows.append(_row(label, [r for r in read_metrics(Path(c.run.run_dir)) if r["step"] > 0]))
            rows[-1]["plan"] = summary.get("plan")
            print(f"  {label:22s} {rows[-1]['samples_per_s']:7.2f} samples/s"
                  + (f"  ({rows[-1]['plan']})" if rows[-1]["plan"] else ""), flush=True)
            if mode == "local":
                break  # runtime.plan does not apply to the single-device trainer
    return _report(rows, root, "real (tiny model, wall seconds)")


def _row(mode: str, records: list[dict]) -> dict:
    steady = records[1:] or records  # the first step pays actor warm-up
    wall = sum(r["step_s"] for r in steady)
    mean = lambda k: sum(r.get(k, 0.0) for r in steady) / len(steady)  # noqa: E731
    return {"mode": mode, "samples_per_s": sum(r["samples"] for r in steady) / wall,
            "step_s": wall / len(steady), "bubble_rollout": mean("bubble_ratio_rollout"),
            "bubble_trainer": mean("bubble_ratio_trainer"),
            "staleness_max": max(r.get("staleness_max", 0) for r in records),
            "weight_sync_s": mean("weight_sync_s"), "reward_mean_last": records[-1]["reward_mean"]}


def bench_emulated(testbed, modes: Optional[Sequence[str]] = None, steps: Optional[int] = None,
                   time_scale: Optional[float] = None, gpus: Optional[int] = None, out: Optional[str] = None,
                   latency: str = "real", run_s: float = 10.0, max_rate: float = 300.0, cache=None,
                   quiet: bool = False) -> dict:
    """Every row of `digenrl simulate` on `testbed`, on the emulated runtime (Ray actors that
    sleep the cost model's time), measured exactly as the simulator measures (report.measure).

    Each row runs the planner's knobs for it (as `simulate` does), so the two tables compare
    like with like: same workers, same steps, same steady-state window. `time_scale` (wall s
    per modelled s) defaults per row to run_s / the simulated run's length (about run_s wall
    seconds per row, at most 1), stretched so that at most `max_rate` units complete per wall
    second (the driver's loop, on a busy machine, falls behind beyond a few hundred).
    `latency`: see digenrl.runtime.emulated. `cache`: an emulated.ActorCache to reuse (else one
    is made and closed). Prints the simulator's table for the emulated rows, then emulated vs
    simulated throughput per row; writes `bench.json` under `out` when given. Returns {"report": emulated Report,
    "simulated": simulated Report, "rows": [{mode, sim, emulated, rel_diff, time_scale,
    latency stats}], "title"}.
    """
    import time

    from digenrl.runtime.cluster import session
    from digenrl.runtime.emulated import ActorCache
    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.planner import PLAN_STEPS
    from digenrl.sim.report import Report
    from digenrl.sim.simulate import ALL, ROWS, homogeneous_reference, simulate
    from digenrl.sim.testbed import load_testbed, resize

    tb = load_testbed(testbed) if isinstance(testbed, str) else testbed
    if gpus is not None:
        tb = resize(tb, gpus)
    modes = list(modes or ALL)
    steps = steps or PLAN_STEPS
    cm = default_cost_model()
    t0 = time.time()
    sim = simulate(tb, modes, steps, cm=cm)
    ref = homogeneous_reference(tb)
    own = cache is None
    rows, emu = [], {}
    with session():
        cache = cache or ActorCache()
        try:
            cache.warm(max(tb.n_gpus, ref.n_gpus))
            for label in modes:
                if label not in sim.rows:  # its plans do not fit here (sim.unfit says why): nothing to emulate
                    continue
                s_row = sim.rows[label]
                where = ref if s_row.spec.mode == "colocated" else tb
                end = max(1e-9, s_row.trace.end)
                scale = time_scale or min(1.0, max(run_s / end, len(s_row.trace.spans) / (max_rate * end)))
                w0 = time.time()
                e_row = emulate_spec(where, s_row.spec, steps, scale, cm, latency=latency, cache=cache)
                emu[label] = e_row
                rows.append({"mode": label, "sim_samples_per_s": s_row.throughput,
                             "emulated_samples_per_s": e_row.throughput,
                             "rel_diff": e_row.throughput / s_row.throughput - 1.0, "time_scale": scale,
                             "wall_s": time.time() - w0, **e_row.latency})
                if not quiet:
                    print(f"  {label:13s} {e_row.throughput:9.3f} samples/s emulated, {s_row.throughput:9.3f} "
                          f"simulated ({100 * rows[-1]['rel_diff']:+.2f}%), time_scale {scale:.3g}, "
                          f"{rows[-1]['wall_s']:.1f} s", flush=True)
        finally:
            if own:
                cache.close()
    rep = Report(tb, sim.reference, steps, emu, sim.ideal_s, {}, sim.plans)
    title = (f"emulated {tb.name}: {tb.n_gpus} Ray actors sleeping the cost model's time, latency={latency}, "
             f"modelled seconds")
    if not quiet:
        print(f"\n{title}")
        print(rep.table())
        print(f"{'mode':<22} {'sim smp/s':>10} {'emu smp/s':>10} {'diff':>7} {'scale':>7} {'RTT ms med/p90':>15} "
              f"{'behind ms p90':>13}")
        for r in rows:
            print(f"{r['mode']:<22} {r['sim_samples_per_s']:>10.3f} {r['emulated_samples_per_s']:>10.3f} "
                  f"{100 * r['rel_diff']:>+6.2f}% {r['time_scale']:>7.3g} "
                  f"{r.get('latency_ms_median', 0):>7.1f}/{r.get('latency_ms_p90', 0):<7.1f} "
                  f"{r.get('behind_ms_p90', 0):>13.1f}")
        print(f"({time.time() - t0:.0f} s; speedup decomposition: `digenrl simulate`)")
    result = {"title": title, "report": rep, "simulated": sim, "rows": rows}
    if out is not None:
        root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        d = rep.to_dict()
        d.update(title=title, latency=latency, agreement=rows)
        (root / "bench.json").write_text(json.dumps(d, indent=1))
        if not quiet:
            print(f"wrote {root / 'bench.json'}")
    return result


def emulate_spec(tb, spec, steps: int, time_scale: float, cm=None, *, latency: str = "real",
                 cache=None, keep_trace: bool = False):
    """`digenrl.sim.report.run_spec` on the emulated runtime: the same Config, contract,
    workers and durations, measured over the same steady-state window (`report.measure`);
    a RunResult in modelled seconds with `.latency` (Ray round trips). Ray must be up."""
    from digenrl.runtime.emulated import latency_stats, run_scheduler_emulated
    from digenrl.sched import Scheduler
    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.report import measure, spec_duration_fn

    cm = cm or default_cost_model()
    cfg, run, fn = spec_duration_fn(tb, spec, steps, cm)
    trace = run_scheduler_emulated(Scheduler(run.sched, run.workers()), fn, time_scale, latency=latency, cache=cache)
    res = measure(tb, spec, trace, fn, steps, keep_trace=True)
    res.latency = latency_stats(trace)
    if not keep_trace:
        res.trace = res.fn = None
    return res


def _report(rows: list[dict], root: Path, title: str) -> list[dict]:
    ref = next((r["samples_per_s"] for r in rows if r["mode"].split(" ")[0] == "colocated"), None)
    for r in rows:
        r["vs_colocated"] = r["samples_per_s"] / ref if ref else None
    print(f"\n{title}")
    print(f"{'mode':22s} {'samples/s':>10s} {'vs coloc':>9s} {'step s':>8s} {'bubble r':>9s} "
          f"{'bubble t':>9s} {'stale':>6s}")
    for r in rows:
        vs = f"{r['vs_colocated']:.2f}x" if r["vs_colocated"] else "-"
        print(f"{r['mode']:22s} {r['samples_per_s']:10.2f} {vs:>9s} {r['step_s']:8.3f} "
              f"{r['bubble_rollout']:9.2f} {r['bubble_trainer']:9.2f} {r['staleness_max']:6d}")
    root.mkdir(parents=True, exist_ok=True)
    (root / "bench.json").write_text(json.dumps({"title": title, "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2, 3.5))
    ax.bar([r["mode"] for r in rows], [r["samples_per_s"] for r in rows], color="#4C72B0")
    ax.set_ylabel("trained samples / s")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(root / "bench.png")
    plt.close(fig)
    print(f"wrote {root / 'bench.json'} and {root / 'bench.png'}")
    return rows


def bench_main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="digenrl bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--real", action="store_true", help="tiny model, real compute on Ray")
    kind.add_argument("--emulated", action="store_true", help="testbed cost model, sleeping Ray workers")
    p.add_argument("--modes", help="comma-separated run modes (--emulated: rows of `digenrl simulate`, "
                   "genrl included); default all")
    p.add_argument("--steps", type=int, help="RL steps per mode (--real: 3; --emulated: as simulate, 12)")
    p.add_argument("--plans", help="--real: comma-separated runtime.plan values to run each mode with "
                   "(never, auto, always); default: the config's")
    p.add_argument("--out", help="output folder (bench.json, bench.png, one run dir per mode)")
    p.add_argument("--config", help="--real: YAML config (pools from runtime.*)")
    p.add_argument("--testbed", help="--emulated: testbed preset or YAML")
    p.add_argument("--gpus", type=int, help="--emulated: resize the testbed")
    p.add_argument("--time-scale", type=float,
                   help="--emulated: wall s per modelled s (default: about --run-s wall seconds per mode)")
    p.add_argument("--run-s", type=float, default=10.0, help="--emulated: wall seconds per mode (auto time scale)")
    p.add_argument("--max-rate", type=float, default=300.0,
                   help="--emulated: at most this many units per wall second (auto time scale)")
    p.add_argument("--latency", default="real", choices=("real", "hidden", "scaled"),
                   help="--emulated: how Ray round trips count (digenrl/runtime/emulated.py)")
    p.add_argument("overrides", nargs="*", help="--real: key=value config overrides")
    args = p.parse_args(argv)
    modes = [m for m in (args.modes or "").replace(" ", ",").split(",") if m]
    if args.emulated:
        from digenrl.sim.simulate import ALL
        from digenrl.sim.testbed import TestbedError, load_testbed

        if not args.testbed:
            p.error("--emulated needs --testbed (a preset name or a YAML file)")
        from digenrl.sim.simulate import NOT_A_ROW

        modes = [m for m in modes or ALL if m != "local"]
        bad = [m for m in modes if m not in ALL]
        if bad:
            p.error(f"--modes: unknown {bad}; allowed: {', '.join(ALL)}" + (f" ({NOT_A_ROW})" if "colocated" in bad else ""))
        if args.steps is not None and args.steps < 3:
            p.error("--steps must be >= 3 (one fill, one measured, one drain step)")
        try:
            tb = load_testbed(args.testbed)
        except (TestbedError, FileNotFoundError) as e:
            p.error(str(e))
        bench_emulated(tb, modes, args.steps, args.time_scale, args.gpus, args.out or "runs/bench-emulated",
                       args.latency, args.run_s, args.max_rate)
        return 0
    try:
        cfg = load_config(args.config, ["run.tensorboard=false"] + list(args.overrides))
    except ConfigError as e:
        print(f"digenrl bench: invalid configuration: {e}", file=sys.stderr)
        return 2
    plans = [x for x in (args.plans or "").split(",") if x] or [None]
    bad = [x for x in plans if x not in (None, *PLAN)]
    if bad:
        p.error(f"--plans: unknown {bad}; allowed: {', '.join(PLAN)}")
    bench_real(cfg, modes or MODES, args.steps or 3, args.out, plans)
    return 0


if __name__ == "__main__":
    sys.exit(bench_main())

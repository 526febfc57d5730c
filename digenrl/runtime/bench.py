"""Modes side by side in one run: `digenrl bench --real` (tiny model) or `--emulated` (testbed).

    digenrl bench --real [--config FILE] [--modes gap,digenrl] [--steps 3] [--out DIR] [key=value ...]
    digenrl bench --emulated --testbed h200x16-flux [--gpus 4] [--time-scale 0.01] [--modes ...]

Real: every mode runs the same config (pools from runtime.*) for `--steps` RL steps on
one Ray cluster; throughput is trained samples per wall second over the steps after the
first (warm-up), bubble ratios are means over those steps. Emulated: the same runtime with
sleeping workers; times are modelled seconds. Both print a table and write
`bench.json` and `bench.png` (samples/s per mode) under --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from digenrl.config import MODES as RUN_MODES, Config, ConfigError, load_config

MODES = tuple(m for m in RUN_MODES if m != "local")


def bench_real(cfg: Config, modes: Sequence[str] = MODES, steps: int = 3,
               out: Optional[str] = None) -> list[dict]:
    """Run each mode for `steps` RL steps on the tiny model; returns one row per mode."""
    import ray

    from digenrl.outputs import read_metrics
    from digenrl.runtime.cluster import connect
    from digenrl.runtime.driver import RayTrainer
    from digenrl.trainer import Trainer

    root = Path(out or Path(cfg.run.run_dir) / "bench")
    rt = cfg.runtime
    started = connect(rt.address, [(rt.rollout, rt.rollout.workers), (rt.trainer, rt.trainer.workers),
                                   (rt.reward, rt.reward.workers)])
    rows = []
    try:
        for mode in modes:
            if mode not in RUN_MODES:
                raise ValueError(f"--modes: {mode!r} is not one of {', '.join(RUN_MODES)}")
            c = copy.deepcopy(cfg)
            c.run.mode, c.train.steps, c.run.run_dir = mode, steps, str(root / mode.replace("+", "_"))
            c.run.tensorboard, c.run.checkpoint_every = False, 0
            if mode == "local":
                Trainer(c, progress=False).train()
            else:
                RayTrainer(c, progress=False, evaluate=False).train()
            rows.append(_row(mode, [r for r in read_metrics(Path(c.run.run_dir)) if r["step"] > 0]))
            print(f"  {mode:13s} {rows[-1]['samples_per_s']:7.2f} samples/s", flush=True)
    finally:
        if started:
            ray.shutdown()
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


def bench_emulated(testbed: str, modes: Sequence[str] = MODES, steps: int = 3, time_scale: float = 0.01,
                   gpus: Optional[int] = None, out: Optional[str] = None) -> list[dict]:
    """Each mode on `testbed` with emulated compute (real Ray actors, sleeping workers)."""
    import ray

    from digenrl.runtime.emulated import run_emulated
    from digenrl.sim.report import resize
    from digenrl.sim.testbed import load_testbed
    from digenrl.trace import bubble_ratios, staleness

    tb = load_testbed(testbed)
    if gpus is not None:
        tb = resize(tb, gpus)
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for mode in modes:
            trace = run_emulated(tb, mode, steps=steps, time_scale=time_scale)
            ends = sorted({s.step: s.end for s in trace.spans if s.kind == "optimizer"}.items())
            t0 = ends[0][1] if len(ends) > 1 else 0.0  # steady state: after the first step
            step_s = (ends[-1][1] - t0) / max(1, len(ends) - 1)
            b = bubble_ratios(trace)
            rows.append({"mode": mode, "samples_per_s": tb.samples_per_step / step_s, "step_s": step_s,
                         "bubble_rollout": b.get("rollout", b.get("colocated", 0.0)),
                         "bubble_trainer": b.get("trainer", b.get("colocated", 0.0)),
                         "staleness_max": max(staleness(trace).values())})
            print(f"  {mode:13s} {rows[-1]['samples_per_s']:7.2f} samples/s (modelled)", flush=True)
    finally:
        if started:
            ray.shutdown()
    root = Path(out or "runs/bench-emulated")
    return _report(rows, root, f"emulated {tb.name} ({tb.n_gpus} GPUs, modelled seconds)")


def _report(rows: list[dict], root: Path, title: str) -> list[dict]:
    ref = next((r["samples_per_s"] for r in rows if r["mode"] == "colocated"), None)
    for r in rows:
        r["vs_colocated"] = r["samples_per_s"] / ref if ref else None
    print(f"\n{title}")
    print(f"{'mode':13s} {'samples/s':>10s} {'vs coloc':>9s} {'step s':>8s} {'bubble r':>9s} "
          f"{'bubble t':>9s} {'stale':>6s}")
    for r in rows:
        vs = f"{r['vs_colocated']:.2f}x" if r["vs_colocated"] else "-"
        print(f"{r['mode']:13s} {r['samples_per_s']:10.2f} {vs:>9s} {r['step_s']:8.3f} "
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
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated run modes")
    p.add_argument("--steps", type=int, default=3, help="RL steps per mode")
    p.add_argument("--out", help="output folder (bench.json, bench.png, one run dir per mode)")
    p.add_argument("--config", help="--real: YAML config (pools from runtime.*)")
    p.add_argument("--testbed", help="--emulated: testbed preset or YAML")
    p.add_argument("--gpus", type=int, help="--emulated: resize the testbed")
    p.add_argument("--time-scale", type=float, default=0.01, help="--emulated: wall s per modelled s")
    p.add_argument("overrides", nargs="*", help="--real: key=value config overrides")
    args = p.parse_args(argv)
    modes = [m for m in args.modes.replace(" ", ",").split(",") if m]
    if args.emulated:
        if not args.testbed:
            p.error("--emulated needs --testbed (a preset name or a YAML file)")
        bench_emulated(args.testbed, [m for m in modes if m != "local"], args.steps, args.time_scale,
                       args.gpus, args.out)
        return 0
    try:
        cfg = load_config(args.config, ["run.tensorboard=false"] + list(args.overrides))
    except ConfigError as e:
        print(f"digenrl bench: invalid configuration: {e}", file=sys.stderr)
        return 2
    bench_real(cfg, modes, args.steps, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(bench_main())

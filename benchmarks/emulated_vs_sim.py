"""Level 2 vs level 3 on the 16-GPU paper presets: emulated runtime vs simulator, every mode.

    python benchmarks/emulated_vs_sim.py [--presets flux,qwen,...] [--run-s 8] [--max-rate 300]
        [--steps 12] [--latency real|hidden] [--json runs/emulated_vs_sim.json]

For each `h200x16-*` preset: `digenrl simulate`'s rows (planner knobs, 12 RL steps), then the
same specs on 16 emulated GPUs (Ray actors sleeping the cost model's time, the real
EventLoop and Scheduler), one Ray cluster and one actor cache for everything. Prints per
preset x mode: simulated samples/s, emulated samples/s, relative difference, the time scale
and the Ray round trip; writes JSON. latency=real (default) charges each round trip at its
real size (the runtime's overhead); hidden compares the schedules only
(digenrl/runtime/emulated.py). Wall time ~ presets x (planning 30-60 s + 8 rows x run_s,
more for rows with thousands of units: --max-rate).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

PRESETS = ("flux", "hunyuan", "qwen", "wan14b")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=",".join(PRESETS), help="h200x16-<name>, comma-separated")
    p.add_argument("--modes", help="rows of digenrl simulate (default all)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--run-s", type=float, default=8.0, help="wall seconds per row (sets the time scale)")
    p.add_argument("--max-rate", type=float, default=300.0, help="max units per wall second")
    p.add_argument("--latency", default="real", choices=("real", "hidden", "scaled"))
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--json", default="runs/emulated_vs_sim.json")
    a = p.parse_args(argv)

    import ray

    from digenrl.tools.bench import bench_emulated
    from digenrl.runtime.emulated import ActorCache

    ray.init(address="local", num_cpus=a.num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    cache = ActorCache()
    out, t0 = {}, time.time()
    try:
        for name in a.presets.split(","):
            tb = name if name.startswith(("h200", "small", "hetero")) else f"h200x16-{name}"
            t = time.time()
            modes = a.modes.split(",") if a.modes else None
            res = bench_emulated(tb, modes, a.steps, None, None, None, a.latency, a.run_s, a.max_rate,
                                 cache=cache, quiet=True)
            out[tb] = {"rows": res["rows"], "wall_s": time.time() - t}
            print(f"\n== {tb} ({time.time() - t:.0f} s)")
            print(f"{'mode':<14} {'sim smp/s':>10} {'emu smp/s':>10} {'diff':>7} {'scale':>7} "
                  f"{'RTT ms med/p90':>15} {'behind p90':>10} {'wall s':>6}")
            for r in res["rows"]:
                print(f"{r['mode']:<14} {r['sim_samples_per_s']:>10.4f} {r['emulated_samples_per_s']:>10.4f} "
                      f"{100 * r['rel_diff']:>+6.2f}% {r['time_scale']:>7.3g} "
                      f"{r.get('latency_ms_median', 0):>7.1f}/{r.get('latency_ms_p90', 0):<7.1f} "
                      f"{r.get('behind_ms_p90', 0):>10.1f} {r['wall_s']:>6.1f}", flush=True)
    finally:
        cache.close()
        ray.shutdown()
    worst = max((abs(r["rel_diff"]), tb, r["mode"]) for tb, v in out.items() for r in v["rows"])
    print(f"\nworst |diff| {100 * worst[0]:.2f}% ({worst[1]} {worst[2]}); {time.time() - t0:.0f} s total")
    path = Path(a.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"latency": a.latency, "steps": a.steps, "presets": out}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

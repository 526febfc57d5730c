"""Planner (analytic split + multi-start local search) vs brute force over the same grid.

    python benchmarks/planner_vs_exhaustive.py [--presets a,b] [--mode digenrl] [--json OUT]

For every preset: the planner's and the exhaustive search's knobs, throughput, the ratio
(target >= 0.95) and how many simulations each ran.
"""

from __future__ import annotations

import argparse
import json

from digenrl.sim.planner import exhaustive, plan
from digenrl.sim.testbed import list_presets, load_testbed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets")
    p.add_argument("--mode", default="digenrl")
    p.add_argument("--json")
    a = p.parse_args(argv)
    names = a.presets.split(",") if a.presets else list_presets()
    rows, worst = [], 1.0
    print(f"{'preset':<30} {'planner knobs':<62} {'ratio':>6} {'sims':>11} {'wall s':>13}")
    for name in names:
        tb = load_testbed(name)
        pl, ex = plan(tb, mode=a.mode), exhaustive(tb, mode=a.mode)
        ratio = pl.throughput / ex.throughput
        worst = min(worst, ratio)
        rows.append({"preset": name, "plan": pl.to_dict(), "exhaustive": ex.to_dict(), "ratio": ratio})
        knobs = ",".join(f"{k}={v}" for k, v in pl.spec.knobs().items())
        print(f"{name:<30} {knobs:<62} {ratio:>6.3f} {pl.evaluated:>5}/{ex.evaluated:<5} "
              f"{pl.wall_s:>6.1f}/{ex.wall_s:<6.1f}", flush=True)
        if ratio < 0.999:
            print(f"{'':<30} exhaustive: {ex.spec.knobs()}")
    print(f"worst planner/exhaustive ratio: {worst:.3f} (target >= 0.95)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if worst >= 0.95 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Planner (analytic split + multi-start local search) vs its unpruned self, or brute force.

    python benchmarks/planner_vs_exhaustive.py [--presets a,b] [--mode digenrl] [--reference unpruned|exhaustive]
        [--json OUT]

For every preset: the planner's knobs and throughput against the reference's, the ratio and how
many simulations each ran. --reference unpruned (default): the same search with every candidate
simulated for 12 steps (planner.plan(prune=False)); the pruned search must choose the same plan
(ratio 1.000, "same"). --reference exhaustive: every point of the grid (target ratio >= 0.95;
hours on the large presets).
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
    p.add_argument("--reference", default="unpruned", choices=("unpruned", "exhaustive"))
    p.add_argument("--json")
    a = p.parse_args(argv)
    names = a.presets.split(",") if a.presets else list_presets()
    rows, worst = [], 1.0
    print(f"{'preset':<30} {'planner knobs':<62} {'ratio':>6} {'plan':>9} {'sims':>11} {'wall s':>13}")
    for name in names:
        tb = load_testbed(name)
        pl = plan(tb, mode=a.mode)
        ex = plan(tb, mode=a.mode, prune=False) if a.reference == "unpruned" else exhaustive(tb, mode=a.mode)
        ratio = pl.throughput / ex.throughput
        worst = min(worst, ratio)
        rows.append({"preset": name, "plan": pl.to_dict(), "exhaustive": ex.to_dict(), "ratio": ratio})
        knobs = ",".join(f"{k}={v}" for k, v in pl.spec.knobs().items())
        same = "same" if pl.spec == ex.spec else "DIFFERENT"
        print(f"{name:<30} {knobs:<62} {ratio:>6.3f} {same:>9} {pl.evaluated:>5}/{ex.evaluated:<5} "
              f"{pl.wall_s:>6.1f}/{ex.wall_s:<6.1f}", flush=True)
        if ratio < 0.999:
            print(f"{'':<30} exhaustive: {ex.spec.knobs()}")
    print(f"worst planner/{a.reference} ratio: {worst:.3f} (target: 1.000 unpruned, >= 0.95 exhaustive)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if worst >= 0.95 else 1


if __name__ == "__main__":
    raise SystemExit(main())

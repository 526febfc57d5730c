"""TAG's mid-trajectory hand-back, both ways, once switches are charged (issue 38).

A trainer that finds training work ready at a segment boundary either hands its partial
trajectory to a rollout worker (runtime.tag_handback=true, a switch back to training at once)
or finishes the trajectory first (false). For each preset, the digenrl (BTS) and greedy TAG
rows at the planner's knobs for gap+tsp+tag, both ways; prints s/step and the switches charged.

    PYTHONPATH=. python benchmarks/tag_handback.py [--presets NAME,...] [--steps 6]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from digenrl.sim.planner import plan
from digenrl.sim.report import run_spec
from digenrl.sim.testbed import list_presets, load_testbed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=",".join(list_presets()))
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    print("| preset | row | knobs | hand-back s/step | finish-first s/step | finish-first / hand-back | switches (hand-back, finish-first) |")
    print("|---|---|---|---|---|---|---|")
    for name in args.presets.split(","):
        tb = load_testbed(name)
        spec = plan(tb, mode="gap+tsp+tag", steps=4).spec
        for mode in ("gap+tsp+tag", "digenrl"):
            rows = {}
            for back in (True, False):
                r = run_spec(tb, replace(spec, mode=mode, tag_handback=back), args.steps, keep_trace=True)
                rows[back] = (r.step_s, r.fn.tag_switches)
            (a, sa), (b, sb) = rows[True], rows[False]
            print(f"| {name} | {mode} | n_rollout {spec.n_rollout}, tag_segment {spec.tag_segment} | {a:.2f} | {b:.2f} "
                  f"| {b / a:.3f} | {sa}, {sb} |", flush=True)


if __name__ == "__main__":
    main()

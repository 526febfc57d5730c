"""A preset where greedy TAG loses throughput against TAG off and BTS does not (issue 38).

Simulates benchmarks/testbeds/greedy-tag-loses.yaml (4 H100 generating as 2 gangs of 2, 4 H100
training, Wan2.1-14B LoRA) at fixed knobs (KNOBS) in three modes: TAG off (gap+tsp), greedy
TAG (gap+tsp+tag) and BTS (digenrl: GAP + TSP + TAG + BTS, TCSS off), each over --steps RL
steps, and prints the steady-state step time (report.measure's window), the throughput, the TAG
switches per step and BTS's decisions side by side.

    PYTHONPATH=. python benchmarks/greedy_tag_loses.py [--steps 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from digenrl.sim.costs import default_cost_model
from digenrl.sim.report import run_spec
from digenrl.sim.testbed import load_testbed
from digenrl.sim.workload import RunSpec

TESTBED = Path(__file__).resolve().parent / "testbeds" / "greedy-tag-loses.yaml"
KNOBS = dict(micro_batch_groups=2, tsp_chunk=1, gen_shard=1, train_shard=1, reshard="after-forward", trainer_sp=1)
MODES = (("TAG off", "gap+tsp", {}), ("greedy TAG", "gap+tsp+tag", {"tag_segment": 3}),
         ("BTS", "digenrl", {"tag_segment": 3}))


def three(steps: int = 8) -> dict:
    """label -> RunResult (with its trace) of the three modes on the preset."""
    tb, cm = load_testbed(TESTBED), default_cost_model()
    return {label: run_spec(tb, RunSpec(mode, **KNOBS, **extra), steps, cm, keep_trace=True)
            for label, mode, extra in MODES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    runs = three(args.steps)
    off = runs["TAG off"].step_s
    print(f"{TESTBED.name}, {args.steps} RL steps, knobs {KNOBS}, tag_segment 3")
    print(f"{'mode':12s} {'step s':>8s} {'samples/s':>10s} {'vs off':>7s} {'switches/step':>14s}")
    for label, r in runs.items():
        print(f"{label:12s} {r.step_s:8.2f} {r.throughput:10.3f} {off / r.step_s:6.3f}x "
              f"{r.fn.tag_switches / args.steps:14.1f}")
    print("switches/step: TAG round trips (Actor -> helper -> Actor) the simulator charged, over all steps "
          "(BTS's first step is greedy: nothing measured yet)")


if __name__ == "__main__":
    main()

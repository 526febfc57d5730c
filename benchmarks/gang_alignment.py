"""Trainer gangs and nodes: the planner's gang on every preset, and how many gangs straddle nodes
under the runtime's placement before and after node alignment.

    python benchmarks/gang_alignment.py [--presets a,b] [--steps 12]

For each preset, DigenRL's plan (`digenrl plan`, pruned search) gives the trainer gang size and
the number of trainer gangs. Then, on the trainer GPUs' pool (gpus_per_node GPUs a node):

    packed    the placement before node alignment: one PACK placement group of every trainer
              rank, in rank order, filling nodes from a node boundary (the best case for it; Ray
              may also start the group mid-node): gang i straddles when its ranks
              [i*gang, (i+1)*gang) cross a node boundary
    aligned   runtime/cluster.py's GangPlacement: one group per gang, on one node wherever a
              node still holds it, placed before the single-device workers: a node takes
              gpus_per_node // gang gangs, the rest straddle (all of them when gang > a node)
    link      what the simulator charges the gang's collectives (Testbed.gang_link)
"""

from __future__ import annotations

import argparse
import time

from digenrl.sim.planner import plan
from digenrl.sim.testbed import list_presets, load_testbed


def straddling_packed(gangs: int, gang: int, gpn: int) -> int:
    return sum((i * gang) // gpn != ((i + 1) * gang - 1) // gpn for i in range(gangs))


def straddling_aligned(gangs: int, gang: int, gpn: int, nodes: int) -> int:
    return gangs if gang > gpn else max(0, gangs - nodes * (gpn // gang))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=None, help="comma-separated preset names (default: all)")
    ap.add_argument("--steps", type=int, default=None, help="RL steps the planner simulates per candidate")
    args = ap.parse_args(argv)
    names = args.presets.split(",") if args.presets else list_presets()
    print("| preset | GPUs/node | trainer GPUs (nodes) | plan: gang x gangs | straddling, packed | straddling, aligned "
          "| link charged | plan time |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        tb = load_testbed(name)
        t0 = time.perf_counter()
        pl = plan(tb, **({"steps": args.steps} if args.steps else {}))
        k = pl.spec.knobs()
        if pl.spec.mode == "colocated":
            print(f"| {name} | - | - | colocated (no trainer gangs) | - | - | - | {time.perf_counter() - t0:.0f} s |")
            continue
        pool = (tb.pool("trainer") or tb.pools)[0]
        gang = k.get("gang") or 1
        trainer_gpus = (pool.count if tb.pool("trainer") else tb.n_gpus - (k.get("n_rollout") or 0))
        gangs = trainer_gpus // gang
        gpn = pool.gpus_per_node
        print(f"| {name} | {gpn} | {trainer_gpus} ({pool.nodes}) | {gang} x {gangs} | "
              f"{straddling_packed(gangs, gang, gpn)} | {straddling_aligned(gangs, gang, gpn, pool.nodes)} | "
              f"{tb.gang_link(pool, gang, gangs)} | {time.perf_counter() - t0:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

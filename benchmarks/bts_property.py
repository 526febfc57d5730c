"""How often BTS is slower than both TAG off and greedy TAG, on random small testbeds (issue 38).

The draws of tests/sched/test_bts.py's slow property (tests/helpers/random_testbeds.bts_draws:
4 or 8 GPUs, a random point of greedy TAG's planner grid with a rollout pool, 4 RL steps), many
more of them: --per-seed draws that run for each seed of --seeds. Prints, per seed, the draws
that ran, those where greedy TAG is slower than TAG off, and those where BTS is slower than both
(with how much), then the totals and BTS's step time over the better of the two per draw; each
counterexample's testbed and knobs go to --out as JSON.

    PYTHONPATH=. python benchmarks/bts_property.py [--seeds 0-3,10-15] [--per-seed 60] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import math
import random
from concurrent.futures import ProcessPoolExecutor

from tests.helpers.random_testbeds import bts_draws

EPS = 1e-9


def seeds_arg(text: str) -> list[int]:
    """'0-3,10-15' -> [0, 1, 2, 3, 10, ..., 15]."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def one_seed(seed: int, per_seed: int) -> dict:
    """The first `per_seed` draws of `seed` that fit: counts and counterexamples."""
    from digenrl.sim.costs import CostModel

    cm, rng = CostModel(), random.Random(seed)
    ran = greedy_loses = 0
    bad, vs_best = [], []
    for d, pt, off, greedy, bts in bts_draws(rng, per_seed, cm):
        ran += 1
        greedy_loses += greedy > off * (1 + EPS)
        vs_best.append(bts / min(off, greedy))
        if bts > max(off, greedy) * (1 + EPS):
            bad.append({"seed": seed, "testbed": d, "knobs": pt, "off": off, "greedy": greedy, "bts": bts,
                        "worse_pct": 100 * (bts / max(off, greedy) - 1)})
    return {"seed": seed, "ran": ran, "greedy_loses": greedy_loses, "bad": bad, "vs_best": vs_best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("0-3,10-15"))
    ap.add_argument("--per-seed", type=int, default=60)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the counterexamples here (JSON)")
    args = ap.parse_args()
    if args.per_seed < 1 or args.jobs < 1:
        ap.error("--per-seed and --jobs must be at least 1")
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one_seed, args.seeds, [args.per_seed] * len(args.seeds)))
    print(f"{'seed':>4} {'ran':>4} {'greedy>off':>10} {'bts>both':>8}  worse by")
    for r in results:
        worse = ", ".join(f"{b['worse_pct']:.1f}%" for b in r["bad"])
        print(f"{r['seed']:>4} {r['ran']:>4} {r['greedy_loses']:>10} {len(r['bad']):>8}  {worse}")
    bad = [b for r in results for b in r["bad"]]
    print(f"all  {sum(r['ran'] for r in results):>4} {sum(r['greedy_loses'] for r in results):>10} {len(bad):>8}")
    ratios = sorted(x for r in results for x in r["vs_best"])
    n = len(ratios)
    print(f"BTS against the better of TAG off and greedy TAG, per draw: geometric mean "
          f"{math.exp(sum(map(math.log, ratios)) / n):.4f}, median {ratios[n // 2]:.4f}, worst {ratios[-1]:.4f}; "
          f"faster in {sum(x < 1 - EPS for x in ratios)}, within 1% in {sum(x <= 1.01 for x in ratios)} of {n}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(bad, f, indent=1)


if __name__ == "__main__":
    main()

"""Spot rollouts on the heterogeneous presets: what the cited spot prices buy (issue 30 part 3).

    PYTHONPATH=. python benchmarks/spot_presets.py [--seeds 8] [--steps 24] [--presets a,b]

For each heterogeneous preset (8 on-demand H200 trainers + 16 rollout GPUs) and each rollout
device (the preset's L40S, or A100; and H100 in their place), DigenRL's plan (simulate.digenrl_plan)
on four clusters, every figure from sim.spot.run_spot over the same steady window:

    H200 alone     the 8 H200 on demand, split by the planner (the cluster without rollout GPUs)
    spot           8 H200 on demand + the rollout GPUs on spot at the device's estimates
                   (devices.SPOT_*: cited price, AWS Spot Advisor's >20%/month edge, AWS's 120 s
                   notice, 600 s to a replacement), mean over --seeds draws, at the rollout pool
                   size (8 or 16 GPUs) that costs least per sample (`digenrl plan --spot`'s choice)
    on-demand      the same cluster, rollout GPUs on demand too (devices.py estimates)
    spot what-if   the same at 1 reclaim per worker-hour with GCP's 30 s notice (an assumption,
                   not a published rate: how the figure holds when reclaims are frequent)

Columns: samples/s, USD per 1,000 samples, and the ratio of samples per dollar to the on-demand
cluster (x od) and to H200 alone (x H200); the what-if also gives its deadlines missed and
regenerated samples per run (means). RLBoost (arXiv 2510.19225) reports 1.51-1.97x throughput and 28-49%
better cost efficiency than on-demand alone; docs/measurements/simulator.md ("Spot rollout pools") sets the two
side by side and names the differences in setting.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

PRESETS = ("hetero-h200x8-l40sx16-flux", "hetero-h200x8-l40sx16-wan14b", "hetero-h200x8-l40sx16-hunyuan",
           "hetero-h200x8-a100x16-qwen")
WHAT_IF = {"interruptions_per_hour": 1.0, "notice_s": 30.0}


def rollout_on(tb, device: str):
    """`tb` with its rollout pool's GPUs replaced by `device` (H100: NVLink inside a node)."""
    (pool,) = tb.pool("rollout")
    if pool.device == device:
        return tb
    new = dataclasses.replace(pool, device=device, intra_link=None if device == "H100" else pool.intra_link)
    return dataclasses.replace(tb, pools=tuple(new if p is pool else p for p in tb.pools),
                               name=f"{tb.name}:rollout-{device}")


def trainers_alone(tb):
    """The trainer pool alone, as one split pool of role any (the planner splits it)."""
    (t,) = tb.pool("trainer")
    return dataclasses.replace(tb, pools=(dataclasses.replace(t, role="any"),), name=f"{tb.name}:trainers-alone")


def mean(runs, f):
    return sum(f(r) for r in runs) / len(runs)


def rows_for(tb, steps: int, seeds: int, cm):
    from digenrl.sim.simulate import digenrl_plan
    from digenrl.sim.spot import plan_spot, resized, run_spot, with_spot
    from digenrl.sim.testbed import spot_spec

    (pool,) = tb.pool("rollout")
    sp = spot_spec({}, pool.device)
    alone_tb = trainers_alone(tb)
    alone = run_spot(alone_tb, digenrl_plan(alone_tb, cm=cm).spec, steps, cm)
    rows = plan_spot(tb, steps, seeds, cm)
    spot = min((r for r in rows if r.spot_gpus == r.rollout_gpus), key=lambda r: r.usd_per_1k)
    od = next(r for r in rows if r.spot_gpus == 0 and r.rollout_gpus == spot.rollout_gpus)
    what = [run_spot(with_spot(resized(tb, spot.rollout_gpus), spot.rollout_gpus, dataclasses.replace(sp, **WHAT_IF)),
                     spot.spec, steps, cm, seed=s) for s in range(seeds)]
    return pool, sp, alone, od, spot, what


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--presets", default=",".join(PRESETS))
    p.add_argument("--devices", default="preset,H100", help="rollout devices: 'preset' (the preset's own) and/or names")
    a = p.parse_args(argv)

    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.testbed import load_testbed

    cm = default_cost_model()
    head = (f"{'preset':<30} {'rollout':<9} {'spot $/h':>8} | {'H200 alone':>17} | {'on-demand (same size)':>23} | "
            f"{'spot':>31} | {'spot what-if (1/h, 30 s)':>45}")
    sub = (f"{'':<30} {'':<9} {'':>8} | {'smp/s':>7} {'$/1k':>9} | {'GPUs':>5} {'smp/s':>7} {'$/1k':>9} | "
           f"{'smp/s':>7} {'$/1k':>7} {'x od':>6} {'x H200':>7} | {'smp/s':>7} {'$/1k':>7} {'x od':>6} {'x H200':>7} "
           f"{'miss':>5} {'regen':>6}")
    print(f"spot rollouts, {a.steps} RL steps, spot rows the mean of {a.seeds} seeds; x: samples per $ against that row")
    print(head)
    print(sub)
    print("-" * len(sub))
    for name in a.presets.split(","):
        base = load_testbed(name)
        for dev in a.devices.split(","):
            tb = base if dev == "preset" else rollout_on(base, dev)
            pool, sp, alone, od, spot, what = rows_for(tb, a.steps, a.seeds, cm)
            s_usd, w_usd = spot.usd_per_1k, mean(what, lambda r: r.usd_per_1k)
            print(f"{name:<30} {pool.device:<9} {sp.price:>8.2f} | {alone.throughput:>7.3f} {alone.usd_per_1k:>9.3f} | "
                  f"{od.rollout_gpus:>5} {od.throughput:>7.3f} {od.usd_per_1k:>9.3f} | "
                  f"{spot.throughput:>7.3f} {s_usd:>7.3f} {od.usd_per_1k / s_usd:>6.3f} "
                  f"{alone.usd_per_1k / s_usd:>7.3f} | "
                  f"{mean(what, lambda r: r.throughput):>7.3f} {w_usd:>7.3f} {od.usd_per_1k / w_usd:>6.3f} "
                  f"{alone.usd_per_1k / w_usd:>7.3f} {mean(what, lambda r: r.deadlines_missed):>5.1f} "
                  f"{mean(what, lambda r: r.regenerated_samples):>6.1f}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

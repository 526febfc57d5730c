"""How close does `gap` (1 rollout + 1 trainer, real tiny model on CPU) get to ideal overlap?

    ideal step time  = max(generate + reward busy time on the rollout worker,
                           train busy time on the trainer)            (from the run's own spans)
    actual step time = time between consecutive optimizer-step completions
    achieved         = ideal / actual                                 (1.0 = perfect overlap)

The non-overlappable tail of a GAP step (train the last micro-batch, optimizer step, weight
sync, generate the next step's first micro-batch) is what separates the two; more
micro-batches per step shrink it. Target: >= 0.85 on 2 CPU cores.

    python benchmarks/runtime_overlap.py [--steps 4] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

DEFAULTS = [
    "run.mode=gap", "run.tensorboard=false", "run.checkpoint_every=0",
    "runtime.rollout.workers=1", "runtime.trainer.workers=1", "runtime.worker_threads=1",
    "data.groups_per_step=8", "data.group_size=4", "data.micro_batch_groups=1",
    "sampling.num_steps=8", "reward.threads=1",
]


def overlap(trace) -> list[dict]:
    """Per RL step: ideal (max of pool busy times), actual (optimizer end to end), achieved."""
    opt_end: dict[int, float] = {}
    first = min(s.start for s in trace.spans)
    for s in trace.spans:
        if s.kind == "optimizer":
            opt_end[s.step] = max(opt_end.get(s.step, 0.0), s.end)
    rows = []
    for k in sorted(opt_end):
        gen = sum(s.end - s.start for s in trace.spans
                  if s.step == k and s.kind in ("generate", "reward") and trace.workers[s.worker] == "rollout")
        train = sum(s.end - s.start for s in trace.spans if s.step == k and s.kind == "train")
        opt = max(s.end - s.start for s in trace.spans if s.step == k and s.kind == "optimizer")
        actual = opt_end[k] - opt_end.get(k - 1, first)
        ideal = max(gen, train)
        rows.append({"step": k, "gen_reward_s": gen, "train_s": train, "optimizer_s": opt,
                     "ideal_s": ideal, "actual_s": actual, "achieved": ideal / actual})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--json", help="write the rows here")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)

    import ray

    from digenrl.config.schema import load_config
    from digenrl.runtime.driver import RayDriver

    run_dir = tempfile.mkdtemp(prefix="overlap-")
    cfg = load_config(None, DEFAULTS + [f"train.steps={args.steps}", f"run.run_dir={run_dir}"]
                      + list(args.overrides))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rt = RayDriver(cfg, progress=False, evaluate=False)
        rt.train()
    finally:
        ray.shutdown()
    rows = overlap(rt.trace)
    print(f"gap, 1 rollout + 1 trainer, {cfg.data.groups_per_step // cfg.data.micro_batch_groups} "
          f"micro-batches/step, {cfg.data.groups_per_step * cfg.data.group_size} samples/step")
    print(f"{'step':>4s} {'gen+rew s':>9s} {'train s':>8s} {'opt s':>6s} {'ideal s':>8s} {'actual s':>9s} "
          f"{'achieved':>9s}")
    for r in rows:
        print(f"{r['step']:4d} {r['gen_reward_s']:9.3f} {r['train_s']:8.3f} {r['optimizer_s']:6.3f} "
              f"{r['ideal_s']:8.3f} {r['actual_s']:9.3f} {r['achieved']:9.1%}")
    steady = rows[1:] or rows  # step 0 includes the pipeline fill
    ideal, actual = sum(r["ideal_s"] for r in steady), sum(r["actual_s"] for r in steady)
    print(f"steady state (steps >= 1): achieved {ideal / actual:.1%} of the ideal overlap bound "
          f"(target >= 85%); trace: {run_dir}/trace.json")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "achieved_steady": ideal / actual}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the default run: wall time and samples/s of `digenrl train` on this machine.

    python benchmarks/train_default.py [--mode local] [--steps N] [key=value ...]

Runs the embedded default configuration end to end (evaluations included) in a temporary
run dir and prints: total wall time, RL-step wall time, samples/s, and the held-out eval
reward before and after. The issue's budget is 5 minutes for the default run on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"run.run_dir={tmp}/run", *args.overrides]
        if args.steps:
            overrides.append(f"train.steps={args.steps}")
        cfg = load_config(None, overrides)
        t0 = time.perf_counter()
        if cfg.run.mode == "local":
            from digenrl.train.trainer import Trainer

            summary = Trainer(cfg, progress=False).train()
        else:
            from digenrl.runtime.driver import RayDriver

            summary = RayDriver(cfg, progress=False).train()
        total = time.perf_counter() - t0
        records = [r for r in read_metrics(f"{tmp}/run") if r["step"] > 0]
    samples = sum(r["samples"] for r in records)
    result = {
        "mode": cfg.run.mode,
        "steps": len(records),
        "total_wall_s": round(total, 1),
        "rl_steps_wall_s": round(summary["wall_s"], 1),
        "samples": samples,
        "samples_per_s": round(samples / summary["wall_s"], 2),
        "eval_reward_before": summary["eval_reward_before"],
        "eval_reward_after": summary["eval_reward_after"],
    }
    print(json.dumps(result, indent=1))
    print(f"default run: {total:.1f} s total ({'within' if total <= 300 else 'OVER'} the 5-minute budget), "
          f"{result['samples_per_s']} samples/s")


if __name__ == "__main__":
    main()

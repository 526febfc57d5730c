"""Held-out gain of one toy-world run: base vs trained on the same prompts and noise.

    python benchmarks/held_out_gain.py [--eval-every K] [key=value ...]     e.g. train.loss=nft sampling.sde=ode run.seed=2

Runs `run.mode=local` (one process; add run.threads=1 to match the figures in the notes),
evaluates the held-out prompts before and after training with the same noise, and prints
one JSON line: the overrides, the held-out mean before and after, the mean paired
difference and its paired t (as tests/test_learning.py measures the default run), the
strict (all-correct) rate before and after, the train reward over the first and last 8
steps, the clip fraction and consistency/* metrics averaged over the steps, and the
training wall time. With --eval-every K it also evaluates every K RL steps and adds the
held-out curve, [[step, mean], ...] from step 0, and the wall time of the training steps
alone, evaluations left out (benchmarks/objectives_table.py uses both).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.train.trainer import Trainer


def measure(overrides: list[str], eval_every: int = 0) -> dict:
    """One toy-world run of `overrides`: the JSON record `main` prints (see the module doc)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"run.run_dir={tmp}/run", "run.mode=local", "run.loggers=[]",
                                 f"run.eval_every={eval_every}", *overrides])
        trainer = Trainer(cfg, progress=False)
        first = trainer.evaluate(0, save_images=False)
        before = trainer.last_eval_rewards.clone()
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
        diff = trainer.last_eval_rewards - before
        rows = read_metrics(cfg.run.run_dir)
    t = diff.mean() / (diff.std() / len(diff) ** 0.5)
    train = [r["reward_mean"] for r in rows if "reward_mean" in r]
    # the clip fraction and the rollout-train gap (consistency/*), each averaged over the RL steps
    steps = [r for r in rows if "clipfrac" in r]
    means = {k: sum(r[k] for r in steps) / len(steps) for k in ("clipfrac", *sorted({k for r in steps for k in r
                                                                                     if k.startswith("consistency/")}))}
    strict = [k for k in first if k.endswith("/strict")]
    out = {"overrides": overrides, "before": before.mean().item(),
           "after": (before + diff).mean().item(), "gain": diff.mean().item(), "t": t.item(),
           "samples": len(diff),
           # the GenEval-style all-correct rate, where the reward reports one
           **({"strict_before": first[strict[0]], "strict_after": rows[-1][strict[0]]} if strict else {}),
           # train reward: mean of the first and of the last 8 RL steps
           "train_first8": sum(train[:8]) / len(train[:8]), "train_last8": sum(train[-8:]) / len(train[-8:]),
           "step_means": means, "wall_s": round(wall, 1)}
    if eval_every:
        out["curve"] = [[0, before.mean().item()]] + [[r["step"], r["eval/reward_mean"]] for r in rows
                                                       if r.get("step", 0) > 0 and "eval/reward_mean" in r]
        out["train_wall_s"] = round(sum(r["step_s"] for r in steps), 1)  # RL steps only, evaluations left out
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every K RL steps (the curve)")
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()
    print(json.dumps(measure(args.overrides, args.eval_every)))


if __name__ == "__main__":
    main()

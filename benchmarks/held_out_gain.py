"""Held-out gain of one toy-world run: base vs trained on the same prompts and noise.

    python benchmarks/held_out_gain.py [key=value ...]     e.g. train.loss=nft sampling.sde=ode run.seed=2

Runs `run.mode=local` (one process; add run.threads=1 to match the figures in the notes),
evaluates the held-out prompts before and after training with the same noise, and prints
one JSON line: the overrides, the held-out mean before and after, the mean paired
difference and its paired t (as tests/test_learning.py measures the default run).
"""

from __future__ import annotations

import argparse
import json
import tempfile

from digenrl.config import load_config
from digenrl.trainer import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"run.run_dir={tmp}/run", "run.mode=local", "run.loggers=[]", "run.eval_every=0",
                                 *args.overrides])
        trainer = Trainer(cfg, progress=False)
        trainer.evaluate(0, save_images=False)
        before = trainer.last_eval_rewards.clone()
        trainer.train()
        diff = trainer.last_eval_rewards - before
    t = diff.mean() / (diff.std() / len(diff) ** 0.5)
    print(json.dumps({"overrides": args.overrides, "before": before.mean().item(),
                      "after": (before + diff).mean().item(), "gain": diff.mean().item(), "t": t.item(),
                      "samples": len(diff)}))


if __name__ == "__main__":
    main()

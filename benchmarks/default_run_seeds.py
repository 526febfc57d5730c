"""The default run, `digenrl train` with no arguments, over seeds and source trees: predicted
against achieved samples/s, staleness, held-out gain, wall time.

    python benchmarks/default_run_seeds.py --trees /path/before /path/after --seeds 0 1 2 [--out DIR]

For each seed, then each tree (interleaved, so machine load hits every tree alike), it runs

    PYTHONPATH=<tree> python -m digenrl.tools.cli train run.run_dir=<dir> run.seed=<s>

one run at a time, with RAY_ADDRESS unset, so that every tree starts a local Ray cluster of
its own sized for its pools: trees from before issue 41 read RAY_ADDRESS=local as Ray's
default local cluster (os.cpu_count() CPUs, 2 here), too small for the 3 one-CPU workers
plan=auto picks, and refuse the placement after runtime.placement_timeout_s. Unset, Ray
would join the cluster named in /tmp/ray/ray_current_cluster (a `ray start` of someone
else's): the script refuses to run while that file exists. It prints one row per run and
a mean per tree:

- load: the 1-minute load average (/proc/loadavg) just before the run starts;
- predicted: the "plan=auto: ... (predicted X samples/s ...)" figure the run printed at its
  start (the simulator's steady-state rate, pipeline fill and drain excluded);
- achieved: the samples of all RL-step records in metrics.jsonl over summary.json's wall_s
  (seconds of RL steps: from the event loop's start to the last optimizer step; the run's
  start-up, profile, planning and the step-0 evaluation are not in it);
- steady: the same over RL steps 3..N only (sum of their `samples` over the sum of their
  `step_s`), closer to the predictor's window;
- ratio: achieved / predicted;
- staleness: max and mean of the per-step `staleness_max` (0 = every trajectory of a step
  from the policy that step updates);
- gain: held-out `eval/reward_mean` at the last step minus at step 0;
- total: wall time of the whole command (Ray start, profile, evaluations included).

`--out DIR` keeps the run dirs and each run's stdout (DIR/<tree name>-s<seed>/, log.txt);
`--json FILE` writes the rows. `overrides` (key=value) go to every run (e.g. train.steps=20
for a quick check; the figures in a report are of the default run, none given).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")  # where ray.init() without an address looks
PREDICTED = re.compile(r"predicted ([0-9.]+) samples/s")


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(tree: str, seed: int, run_dir: Path, overrides: list[str]) -> dict:
    """One `digenrl train` run of `tree` with `seed`: the row the module doc describes."""
    if CURRENT_CLUSTER.exists():
        raise RuntimeError(f"{CURRENT_CLUSTER} exists: a run without RAY_ADDRESS would join that cluster")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = tree
    cmd = [sys.executable, "-m", "digenrl.tools.cli", "train", f"run.run_dir={run_dir}", f"run.seed={seed}",
           *overrides]
    load = load1()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    total = time.perf_counter() - t0
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.txt").write_text(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (PYTHONPATH={tree}) exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "reward_mean" in r]  # RL step records (step 0's evaluation has none)
    evals = [r for r in rows if "eval/reward_mean" in r]
    found = PREDICTED.search(proc.stdout) or PREDICTED.search(summary.get("plan", ""))
    predicted = float(found.group(1)) if found else None
    samples = sum(r["samples"] for r in steps)
    achieved = samples / summary["wall_s"]
    late = [r for r in steps if r["step"] >= 3]
    steady = sum(r["samples"] for r in late) / sum(r["step_s"] for r in late) if late else None
    stale = [r.get("staleness_max", 0) for r in steps]
    return {"tree": tree, "seed": seed, "load1": load, "predicted": predicted, "achieved": achieved,
            "steady": steady, "ratio": achieved / predicted if predicted else None,
            "steps": len(steps), "samples": samples, "rl_wall_s": summary["wall_s"],
            "staleness_max": max(stale), "staleness_mean": sum(stale) / len(stale),
            "eval_step0": evals[0]["eval/reward_mean"], "eval_last": evals[-1]["eval/reward_mean"],
            "eval_last_step": evals[-1]["step"], "gain": evals[-1]["eval/reward_mean"] - evals[0]["eval/reward_mean"],
            "total_s": total}


def table(rows: list[dict]) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = (f"{'tree':<28} {'seed':>4} {'load':>5} {'pred/s':>7} {'ach/s':>6} {'steady':>6} {'ach/pred':>8} "
            f"{'stale max/mean':>14} {'eval0':>7} {'evalN':>7} {'gain':>7} {'RL s':>6} {'total s':>7}")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['tree'][-28:]:<28} {r['seed']:>4} {r['load1']:>5.2f} {f(r['predicted'], '7.1f')} "
                   f"{r['achieved']:>6.1f} {f(r['steady'], '6.1f')} {f(r['ratio'], '8.2f')} "
                   f"{r['staleness_max']:>6}/{r['staleness_mean']:<7.2f} {r['eval_step0']:>7.4f} {r['eval_last']:>7.4f} "
                   f"{r['gain']:>+7.4f} {r['rl_wall_s']:>6.1f} {r['total_s']:>7.1f}")
    for tree in dict.fromkeys(r["tree"] for r in rows):
        mine = [r for r in rows if r["tree"] == tree]

        def mean(k):
            vals = [r[k] for r in mine if r[k] is not None]
            return sum(vals) / len(vals) if vals else None

        out.append(f"{'mean ' + tree[-23:]:<28} {len(mine):>4} {mean('load1'):>5.2f} {f(mean('predicted'), '7.1f')} "
                   f"{mean('achieved'):>6.1f} {f(mean('steady'), '6.1f')} {f(mean('ratio'), '8.2f')} "
                   f"{max(r['staleness_max'] for r in mine):>6}/{mean('staleness_mean'):<7.2f} "
                   f"{mean('eval_step0'):>7.4f} {mean('eval_last'):>7.4f} {mean('gain'):>+7.4f} "
                   f"{mean('rl_wall_s'):>6.1f} {mean('total_s'):>7.1f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", nargs="+", required=True, help="source trees (each a PYTHONPATH root)")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", default=None, help="keep run dirs and logs here (default: a temporary dir)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in args.trees]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        for seed in args.seeds:
            for i, tree in enumerate(trees):
                row = measure(tree, seed, out / f"{i}-{Path(tree).name}-s{seed}", args.overrides)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()

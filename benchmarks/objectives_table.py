"""The objectives side by side on the toy world: held-out gain, paired t, train time, steps to a score.

    PYTHONPATH=. python benchmarks/objectives_table.py [--seeds 0 1 2] [--steps 160] [--eval-every 20]
        [--jobs 2] [--raw out.jsonl] [--objective NAME='key=value ...' ...] [common key=value ...]

Each objective (default: grpo, and awm on ODE rollouts) runs benchmarks/held_out_gain.py's
measurement once per seed (run.mode=local, run.threads=1, one process per run, --jobs at a
time), evaluating every --eval-every RL steps. It prints one markdown table whose header
holds the exact command: per objective the held-out gain (mean over seeds, and each seed's
with its paired t over the held-out samples), the held-out mean before and after, the wall
time of the training steps (evaluations left out, mean over seeds), and the RL steps the
objective needs to reach the first objective's final held-out mean (the seeds' mean curve,
at the evaluation cadence; "not reached" if it never does). --raw keeps every run's JSON
record (with its curve); --from-raw prints the table again from such a file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> overrides; the first is the reference whose final held-out mean the others must reach
DEFAULT_OBJECTIVES = {
    "grpo": "",
    # AWM needs no log-probs: ODE rollouts; two noise draws per sample, each its own levels among
    # all ten (the same forward+backward count per sample as grpo's two trained SDE steps)
    "awm": "train.loss=awm sampling.sde=ode sampling.window_draw=sample",
}


def _run(name: str, overrides: list[str], seed: int, eval_every: int) -> dict:
    cmd = [sys.executable, str(HERE / "held_out_gain.py"), f"--eval-every={eval_every}", "run.threads=1",
           *overrides, f"run.seed={seed}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} seed {seed} failed:\n{out.stderr[-3000:]}")
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return {"objective": name, "seed": seed, **rec}


def steps_to(curve: list[list[float]], target: float) -> str:
    """The first evaluated step whose held-out mean reaches `target`, or 'not reached'."""
    for step, mean in curve:
        if mean >= target:
            return str(int(step))
    return "not reached"


def mean_curve(records: list[dict]) -> list[list[float]]:
    """The seeds' mean held-out curve (the steps every record evaluated)."""
    steps = sorted(set.intersection(*[{s for s, _ in r["curve"]} for r in records]))
    by = [dict((s, m) for s, m in r["curve"]) for r in records]
    return [[s, sum(b[s] for b in by) / len(by)] for s in steps]


def table(records: list[dict], command: str) -> str:
    names = list(dict.fromkeys(r["objective"] for r in records))
    per = {n: [r for r in records if r["objective"] == n] for n in names}
    ref = names[0]
    target = sum(r["after"] for r in per[ref]) / len(per[ref])
    lines = [f"`{command}`", "",
             f"| objective | overrides | held-out before -> after | gain (mean) | gain / paired t per seed "
             f"| train wall s (mean) | steps to {ref}'s final {target:.3f} |",
             "|---|---|---|---|---|---|---|"]
    for n in names:
        rs = sorted(per[n], key=lambda r: r["seed"])
        k = len(rs)
        before = sum(r["before"] for r in rs) / k
        after = sum(r["after"] for r in rs) / k
        gain = sum(r["gain"] for r in rs) / k
        seeds = ", ".join(f"s{r['seed']}: {r['gain']:+.3f} / {r['t']:.1f}" for r in rs)
        wall = sum(r.get("train_wall_s", r["wall_s"]) for r in rs) / k
        reach = steps_to(mean_curve(rs), target) if all("curve" in r for r in rs) else "-"
        over = " ".join(o for o in rs[0]["overrides"] if not o.startswith(("run.seed=", "run.threads=", "--")))
        lines.append(f"| {n} | `{over or '(defaults)'}` | {before:.3f} -> {after:.3f} | {gain:+.3f} | {seeds} "
                     f"| {wall:.0f} | {reach} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=160, help="train.steps of every run")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    ap.add_argument("--objective", action="append", default=[], metavar="NAME='k=v ...'",
                    help="an objective and its overrides (repeatable; default: grpo, awm)")
    ap.add_argument("--raw", help="write every run's JSON record here, one a line")
    ap.add_argument("--from-raw", help="print the table from a --raw file instead of running")
    ap.add_argument("common", nargs="*", help="overrides for every run, key=value")
    args = ap.parse_args()
    command = "PYTHONPATH=. python benchmarks/objectives_table.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.from_raw:
        records = [json.loads(line) for line in Path(args.from_raw).read_text().splitlines() if line.strip()]
        print(table(records, command))
        return
    objectives = dict(o.split("=", 1) for o in args.objective) if args.objective else DEFAULT_OBJECTIVES
    jobs = [(n, [*args.common, f"train.steps={args.steps}", *shlex.split(o)], seed)
            for n, o in objectives.items() for seed in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(lambda j: _run(*j, args.eval_every), jobs))
    if args.raw:
        Path(args.raw).write_text("".join(json.dumps(r) + "\n" for r in records))
    print(table(records, command))


if __name__ == "__main__":
    main()

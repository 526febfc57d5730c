"""Trajectory bytes per RL step, before and after lean trajectories, for every recipe's shape.

    python benchmarks/trajectory_bytes.py [recipes/*.yaml ...]
    python benchmarks/trajectory_bytes.py --run-dir DIR     a finished Ray run: counted vs simulated

--run-dir: per RL step, the run's counted `transfer/trajectory_bytes` (metrics.jsonl), what the
simulator predicts for the schedule the run took (its trace.jsonl, its planned config.json), and
what the same Train units received before lean trajectories.

Each recipe's Config, RL step 0, through sim.trajectories.TrajectoryBytes: the bytes the trainer
ranks receive (the runtime's `transfer/trajectory_bytes` counter counts the same objects; see
tests/sim/test_trajectory_bytes.py and tests/runtime/test_gangs.py). "before": every rank of a
trainer gang received its unit's rows with every latent x_0 .. x_T; "after": each rank its own
rows (DPO: the unit's), each row the latents its objective reads (math.payload). Latents and
log-probs only (the conditioning and the decoded media are not counted, before or after).
Latent sizes are the catalogue's (sim.catalogue.latent_values) for the family's first entry at
the recipe's model.height x width x frames. Nothing is generated: no model files are read.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

from digenrl.config.schema import load_config
from digenrl.sim.trajectories import TrajectoryBytes

ROOT = Path(__file__).resolve().parents[1]


def rows(paths: list[str]) -> list[tuple[str, int, int]]:
    out = []
    for path in paths:
        cfg = load_config(path)
        out.append((Path(path).stem, TrajectoryBytes(cfg, lean=False).step(0), TrajectoryBytes(cfg).step(0)))
    return out


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return ""


def run_dir(path: str) -> None:
    import json

    from digenrl.io.outputs import read_metrics
    from digenrl.io.trace import read_trace
    from digenrl.sim.trajectories import predict_trajectory_bytes

    d = Path(path)
    cfg = load_config(None, tree=json.loads((d / "config.json").read_text()))
    trace = read_trace(d / "trace.jsonl")
    predicted = predict_trajectory_bytes(cfg, trace)
    full = TrajectoryBytes(cfg, lean=False)
    print(f"{'step':>4s} {'counted':>12s} {'simulated':>12s} {'before':>12s} {'ratio':>6s}")
    for rec in [r for r in read_metrics(d) if r["step"] > 0]:
        i = rec["step"] - 1
        before = sum(full.unit(s.unit) for s in trace.spans if s.kind == "train" and s.unit is not None
                     and s.unit.step == i and not (s.extra or {}).get("lost"))
        got = rec["transfer/trajectory_bytes"]
        print(f"{rec['step']:4d} {got:12d} {predicted[i]:12d} {before:12d} {before / got:6.2f}")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--run-dir"]:
        return run_dir(argv[1])
    paths = argv or sorted(glob.glob(str(ROOT / "recipes" / "*.yaml")))
    print(f"{'recipe':34s} {'before/step':>12s} {'after/step':>12s} {'ratio':>7s}")
    for name, before, after in rows(paths):
        print(f"{name:34s} {human(before):>12s} {human(after):>12s} {before / after:7.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])

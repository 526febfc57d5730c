"""The paper-preset table: every packaged testbed, every mode, side by side.

    python benchmarks/sim_presets.py [--out results/sim] [--steps 12] [--presets a,b]

Prints one table per preset (see docs/simulator.md for the columns) and writes
report-<preset>.json, gantt-<preset>-<mode>.png and summary.json into --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from digenrl.sim.simulate import simulate
from digenrl.sim.testbed import list_presets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/sim")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--presets", help="comma-separated preset names (default: all but the small test preset)")
    a = p.parse_args(argv)
    names = a.presets.split(",") if a.presets else [n for n in list_presets() if not n.startswith("small")]
    summary = {}
    for name in names:
        t0 = time.perf_counter()
        rep = simulate(name, steps=a.steps, out_dir=a.out)
        print(rep.table())
        print(f"({time.perf_counter() - t0:.1f} s)\n", flush=True)
        d = rep.to_dict()
        summary[name] = {
            "digenrl_utilisation": d["rows"]["digenrl"]["utilisation"],
            "speedups": {b: x["total"] for b, x in d["decomposition"].items()},
            "factors": {b: x["factors"] for b, x in d["decomposition"].items()},
        }
    print("== summary: digenrl utilisation of the ideal bound, speedups")
    for name, s in summary.items():
        sp = "  ".join(f"{b} {v:.2f}x" for b, v in s["speedups"].items())
        print(f"{name:<32} util {100 * s['digenrl_utilisation']:5.1f}%  {sp}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A fingerprint of the simulator's behaviour: what a restructuring must leave unchanged.

    python benchmarks/sim_fingerprint.py                 # one line per preset, then the total
    python benchmarks/sim_fingerprint.py --out fp.json   # also every row's figures, to diff

For every packaged preset and every row `digenrl simulate` prints (simulate.ROWS), one run at
the row's default knobs (RunSpec(mode, style): no planner search, so it takes seconds) for
STEPS RL steps: the exact trace (every span's worker, kind, unit, start and end) and the
measured figures are hashed. Rows that do not fit are fingerprinted by their refusal. Then the
planner's choice for every row of the small preset (`plan`, pruned search), by its knobs. Two
trees with the same total fingerprint simulate the same schedules at the same times and
plan the same; a differing preset line says where to look (diff the --out files).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

STEPS = 6
PLANNED = "small-h200x16-sd35"


def _trace_key(trace) -> list:
    return [(s.worker, s.kind, repr(s.unit), repr(s.start), repr(s.end)) for s in trace.spans]


def row_figures(tb, label: str, cm) -> dict:
    from digenrl.sim.report import run_spec
    from digenrl.sim.workload import RunSpec
    from digenrl.sim.simulate import ROWS

    mode, style = ROWS[label]
    try:
        res = run_spec(tb, RunSpec(mode, style=style), STEPS, cm, keep_trace=True)
    except Exception as e:  # noqa: BLE001 - a refusal is part of the fingerprint
        return {"refused": f"{type(e).__name__}: {e}"}
    digest = hashlib.sha256(repr(_trace_key(res.trace)).encode()).hexdigest()[:16]
    return {"throughput": repr(res.throughput), "staleness_max": res.staleness_max, "trace": digest}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write every row's figures here (JSON)")
    p.add_argument("--presets", help="comma-separated presets (default: all)")
    args = p.parse_args(argv)

    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.planner import PLAN_STEPS, plan
    from digenrl.sim.simulate import ROWS
    from digenrl.sim.testbed import list_presets, load_testbed

    cm = default_cost_model()
    presets = args.presets.split(",") if args.presets else list_presets()
    out: dict = {}
    for name in presets:
        tb = load_testbed(name)
        out[name] = {label: row_figures(tb, label, cm) for label in ROWS}
        line = hashlib.sha256(json.dumps(out[name], sort_keys=True).encode()).hexdigest()[:16]
        print(f"{name:34s} {line}", flush=True)
    if PLANNED in presets:
        tb = load_testbed(PLANNED)
        planned = {}
        for label in ROWS:
            mode, style = ROWS[label]
            try:
                planned[label] = plan(tb, mode=mode, style=style, steps=PLAN_STEPS, cm=cm).spec.knobs()
            except Exception as e:  # noqa: BLE001
                planned[label] = f"{type(e).__name__}: {e}"
        out["plans:" + PLANNED] = planned
        line = hashlib.sha256(json.dumps(planned, sort_keys=True, default=str).encode()).hexdigest()[:16]
        print(f"{'plans:' + PLANNED:34s} {line}")
    total = hashlib.sha256(json.dumps(out, sort_keys=True, default=str).encode()).hexdigest()[:16]
    print(f"{'total':34s} {total}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

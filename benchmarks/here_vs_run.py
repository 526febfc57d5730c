"""What runtime.plan charged against what a Ray run took, unit kind by unit kind.

    python benchmarks/here_vs_run.py RUN_DIR [RUN_DIR ...]

Reads a finished Ray run's config.json (the planned knobs), profile.jsonl (the profile lines
runtime.plan priced it with, and the node's cores), trace.jsonl and metrics.jsonl; simulates
the same config on those lines as digenrl.sim.here does (MeasuredDurations, the shared-core
slowdown, the virtual clock and the real scheduler) for the run's own number of steps; and
prints, for the simulated and the real run:

- per unit kind: units, mean seconds per unit (real: the span the worker reported, from
  method entry to return);
- per worker: the mean gap between a unit's end and the next unit's start on that worker
  (real: the driver noticing the end, scheduling, dispatching, and the worker receiving its
  inputs; simulated: waits for inputs only);
- seconds per RL step over steps 3..N (optimizer-step ends; the steady window) and the
  samples/s this gives;
- where the run's plan probed the runtime (runtime.plan_probe_steps: profile.jsonl has its
  "runtime" line), "simulated" prices with it, as the plan did, and "compute" without it;
- where the run evaluates (run.eval_every > 0), the simulated step with the evaluation
  actor's CPU charged as plan_here charges it (taken from the workers' cores);
- with `--charge KIND=SECONDS` (repeatable; KIND a unit kind or `all`), one more simulated row
  with those seconds added to every unit of the kind: what charging a per-unit cost the profile
  does not time would predict (e.g. each kind's measured excess, then a dispatch for all);
- with `--transitions`, the gaps on a worker by (role, unit kind before, unit kind after),
  real beside simulated, largest real total first: which waits the run pays that the
  simulation does not; where the trace says when the driver sent each unit (runs since
  2026-12-04), the part of each gap after it was sent (the dispatch) apart.

The differences say what the predictor misses: a unit kind that takes longer than charged
(cores shared more than the slowdown says), or a per-unit gap (dispatch and bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from digenrl.config.contract import contract
from digenrl.config.schema import Config, load_config
from digenrl.io.trace import Trace, read_trace
from digenrl.sched import KINDS, Scheduler, kind
from digenrl.sim.engine import run_virtual
from digenrl.runtime.driver import _eval_samples
from digenrl.sim.here import MeasuredCosts, MeasuredDurations, RuntimeCosts, eval_cpu_s, slowdown


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_run(run_dir: Path) -> tuple[Config, list[dict]]:
    """A run's config (config.json) and the profile lines its plan priced (profile.jsonl)."""
    return load_config(None, tree=json.loads((run_dir / "config.json").read_text())), \
        read_jsonl(run_dir / "profile.jsonl")


def simulate(cfg: Config, lines: list[dict], charge: dict | None = None, probe: bool = True) -> tuple[Trace, float]:
    """A run's config on its profile lines (read_run), as plan_here prices a candidate; and the
    slowdown. `probe`: with the runtime costs its probe measured (the profile's "runtime" line,
    when it has one); `charge`: seconds added to each unit of a kind (its span kind, or "all"),
    after the slowdown."""
    run = contract(cfg)
    slow = slowdown(cfg, run, lines[0]["cores"])
    fn = MeasuredDurations(MeasuredCosts.from_lines(lines), run, slow,
                           RuntimeCosts.from_lines(lines) if probe else None)
    if charge:
        base = fn

        def fn(worker, unit):
            return base(worker, unit) + charge.get(kind(unit), 0.0) + charge.get("all", 0.0)
    return run_virtual(Scheduler(run.sched, run.workers()), fn), slow


def parse_charge(items: list[str]) -> dict[str, float]:
    """--charge KIND=SECONDS items as {kind: seconds}; a bad item exits naming it."""
    out = {}
    for item in items:
        name, _, sec = item.partition("=")
        try:
            out[name] = float(sec)
        except ValueError:
            raise SystemExit(f"--charge {item!r}: want KIND=SECONDS") from None
        if name not in (*KINDS.values(), "all"):
            raise SystemExit(f"--charge {item!r}: KIND is one of {', '.join(KINDS.values())}, all")
    return out


def consecutive(trace: Trace):
    """(worker, a unit's span, the next span on that worker), for every worker of `trace`."""
    by = defaultdict(list)
    for s in trace.spans:
        by[s.worker].append(s)
    for w, spans in by.items():
        spans.sort(key=lambda s: s.start)
        for a, b in zip(spans, spans[1:]):
            yield w, a, b


def window(trace: Trace) -> tuple[float, float, int]:
    """Steps 3..N of a trace: (start, end, steps), between optimizer-step ends (0-based step 2
    ends where step 3 starts)."""
    opt_end: dict[int, float] = {}
    for s in trace.spans:
        if s.kind == "optimizer":
            opt_end[s.step] = max(opt_end.get(s.step, 0.0), s.end)
    last = max(opt_end)
    return opt_end[2], opt_end[last], last - 2


def describe(trace: Trace, samples_per_step: int) -> dict:
    n, busy = Counter(), Counter()
    for s in trace.spans:
        n[s.kind] += 1
        busy[s.kind] += s.end - s.start
    gaps = [max(0.0, b.start - a.end) for _, a, b in consecutive(trace)]
    t0, t1, steps = window(trace)
    per_step = (t1 - t0) / steps
    return {"units": dict(n), "mean_s": {k: busy[k] / n[k] for k in n}, "gap_mean_s": statistics.mean(gaps),
            "gap_median_s": statistics.median(gaps), "s_per_step": per_step, "samples_per_s": samples_per_step / per_step}


def transitions(trace: Trace) -> dict:
    """Per (worker role, unit kind before, unit kind after) on one worker: the gaps between the
    two units, [count, total seconds, median seconds, seconds of them after the driver sent the
    second unit]: where a run waits between units. A Ray run's spans carry when the driver sent
    them (extra "sent", runtime/loop.py), which splits a gap into the driver's part (noticing the
    first unit's end, the inputs the second waits for, scheduling) and the dispatch (the call
    reaching the worker and its inputs resolved); None where a trace has no "sent"."""
    gaps, sent = defaultdict(list), defaultdict(list)
    for w, a, b in consecutive(trace):
        key = (w.rsplit("-", 1)[0], a.kind, b.kind)
        gaps[key].append(max(0.0, b.start - a.end))
        if b.extra and "sent" in b.extra:
            sent[key].append(max(0.0, b.start - max(a.end, b.extra["sent"])))
    return {k: [len(v), sum(v), statistics.median(v), sum(sent[k]) if k in sent else None] for k, v in gaps.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--transitions", action="store_true",
                    help="also the gaps by (role, unit before, unit after), simulated and real, largest total first")
    ap.add_argument("--charge", action="append", default=[], metavar="KIND=SECONDS",
                    help="another simulated row with SECONDS added to each unit of KIND (a unit kind, or all)")
    args = ap.parse_args()
    charge = parse_charge(args.charge)
    for rd in map(Path, args.run_dirs):
        metrics = [r for r in read_jsonl(rd / "metrics.jsonl") if "reward_mean" in r]
        spp = metrics[0]["samples"]
        cfg, lines = read_run(rd)
        sim, slow = simulate(cfg, lines)
        rows = {"simulated": describe(sim, spp)}
        probed = RuntimeCosts.from_lines(lines)
        if probed is not None:  # the plan priced the probe's runtime costs: the compute alone beside it
            rows["compute"] = describe(simulate(cfg, lines, probe=False)[0], spp)
        if charge:
            rows["+ charges"] = describe(simulate(cfg, lines, charge)[0], spp)
        trace = read_trace(rd / "trace.jsonl")
        rows["real"] = describe(trace, spp)
        print(f"{rd}  (slowdown charged {slow:.2f}" +
              (f"; runtime probe: {probed.describe()})" if probed is not None else ")"))
        kinds = sorted(rows["real"]["units"])
        print(f"  {'':10} {'s/step':>7} {'samples/s':>9} {'gap mean':>9} {'gap med':>8}  " +
              "  ".join(f"{k} n / ms" for k in kinds))
        for name, r in rows.items():
            print(f"  {name:10} {r['s_per_step']:7.3f} {r['samples_per_s']:9.1f} {1e3 * r['gap_mean_s']:8.1f}ms "
                  f"{1e3 * r['gap_median_s']:6.1f}ms  " +
                  "  ".join(f"{r['units'].get(k, 0)} / {1e3 * r['mean_s'].get(k, 0):.1f}" for k in kinds))
        e = eval_cpu_s(cfg, MeasuredCosts.from_lines(lines), _eval_samples(cfg))
        if e:  # as plan_here prices a step (sim.here.steady_step): its CPU taken from the workers
            cores = lines[0]["cores"]
            per = rows["simulated"]["s_per_step"] + e / cores
            print(f"  simulated with the evaluation's {e:.3f} CPU s a step on {cores} cores: {per:.3f} s/step, "
                  f"{spp / per:.1f} samples/s (as the plan prices it)")
        if args.transitions:
            real, simulated = transitions(trace), transitions(sim)
            print(f"  {'gaps on a worker':34} {'real n':>7} {'total s':>8} {'median ms':>9} {'dispatch s':>10}   "
                  f"{'simulated n':>11} {'total s':>8}")
            for key, (n, total, med, disp) in sorted(real.items(), key=lambda kv: -kv[1][1]):
                sn, st, _, _ = simulated.get(key, (0, 0.0, 0.0, None))
                d = "-" if disp is None else f"{disp:.2f}"
                print(f"  {' -> '.join(key):34} {n:7d} {total:8.2f} {1e3 * med:9.1f} {d:>10}   {sn:11d} {st:8.2f}")


if __name__ == "__main__":
    main()

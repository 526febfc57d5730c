"""The paper's cumulative ablation on its testbeds, on the simulator (issue 38, item 4).

Testbeds (benchmarks/testbeds/paper-*.yaml): A, 32x RTX A6000-class (48 GB, 200 Gb/s); B, 32x
H100 80 GB (400 Gb/s); C, 16x RTX PRO 6000 Blackwell-class (96 GB, 200 Gb/s); A+C (the 96 GB
cards train, the 48 GB cards generate). Workloads: HunyuanVideo-13B with DanceGRPO; Wan2.1-14B,
FLUX.1-12B and Qwen-Image-20B with Flow-GRPO; a mini-batch of 32 samples per RL step; 20, 30
or 40 sampling steps; trained-timestep fraction 0.4 or 0.6 (trained steps = int(steps x
fraction)). What the paper does not say is a guess marked in each YAML.

Rows, each on top of the one before (ABLATION), then the baselines as simulate() runs them:
disaggregated only (run.mode=disagg-sync), +GAP (gap), +TSP (gap+tsp), +TAG (gap+tsp+tag:
greedy TAG), +BTS (digenrl with TCSS off), +TCSS (digenrl, TCSS on at a stale fraction of
0.5); veRL-Omni and GenRL as they ship, and colocated-ideal. Every row gets its best knobs
from the planner, as `digenrl simulate` does (simulate.simulate for the rows it has; a row
with fixed RunSpec fields is planned with those fields set on every point, the search started
from the plans of the rungs below it too, then run_spec measures it over planner.PLAN_STEPS
steps). Throughput is trained samples per second in the
steady state (report.py); speedups are throughput ratios, per dollar where the baseline ran on
another cluster (a heterogeneous testbed's colocated rows run on the homogeneous reference,
simulate.homogeneous_reference). The abstract claims 1.56-2.10x over veRL-Omni and GenRL.
Where a peer's shipped layout does not fit in our memory model (the 48 GB cards), the paper
still ran it: the row is then planned and simulated without the memory check and marked
"over memory", with the figure that says it does not fit.

A row whose fixed fields the simulator does not have yet (RunSpec.tcss_fraction, from issue 38
items 2-3) is listed as not run, with the reason; until then the row "TAG+TCSS (built-in)"
runs today's run.mode=digenrl (GAP+TSP+TAG+TCSS at its built-in staleness). Only ABLATION
changes when those land.

    PYTHONPATH=. python benchmarks/paper_ablation.py --quick          # C x FLUX.1, ~1 min
    PYTHONPATH=. python benchmarks/paper_ablation.py                  # 16 testbed x workload
    PYTHONPATH=. python benchmarks/paper_ablation.py --sweep          # x 20/30/40 steps x 0.4/0.6
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from digenrl.sim.costs import default_cost_model
from digenrl.sim.planner import PLAN_STEPS, plan
from digenrl.sim.report import run_spec
from digenrl.sim.simulate import simulate
from digenrl.sim.testbed import load_testbed
from digenrl.sim.workload import RunSpec

TESTBEDS = Path(__file__).resolve().parent / "testbeds"
CLUSTERS = ("a", "b", "c", "ac")
WORKLOADS = ("hunyuan", "wan14b", "flux", "qwen")
STEPS = (20, 30, 40)
FRACTIONS = (0.4, 0.6)
PAPER = (1.56, 2.10)  # the abstract's speedups over veRL-Omni and GenRL
QUICK = ("c", "flux")


@dataclass(frozen=True)
class Row:
    """One rung of the ablation: a `digenrl simulate` row label (report.ROWS) whose best plan is
    taken, with `fixed` RunSpec fields set on every point the planner tries (planner.plan(fixed=)).
    `unless`: a RunSpec field whose presence retires this row (a stand-in for rows that field
    makes possible)."""

    label: str
    mode: str
    fixed: dict = field(default_factory=dict)
    unless: str | None = None
    what: str = ""


ABLATION = (
    Row("disaggregated only", "disagg-sync", what="rollout and trainer pools, one step at a time"),
    Row("+GAP", "gap", what="generation-axis fragments, training streams behind generation"),
    Row("+TSP", "gap+tsp", what="packed (sample, timestep) training passes"),
    Row("+TAG (greedy)", "gap+tsp+tag", what="trainers generate whenever they would wait"),
    Row("+BTS", "digenrl", {"tcss_fraction": 0.0}, what="TAG only where it shortens the predicted makespan"),
    Row("+TCSS 0.5", "digenrl", {"tcss_fraction": 0.5}, what="up to half of the next step generated stale"),
    Row("TAG+TCSS (built-in)", "digenrl", unless="tcss_fraction",
        what="today's run.mode=digenrl: GAP+TSP+TAG+TCSS, no BTS"),
)
BASELINE_ROWS = ("verl-omni", "genrl", "colocated-ideal")
VS = ("verl-omni", "genrl")


def runnable(row: Row) -> str | None:
    """None when the simulator can run `row`, else why not."""
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    missing = [k for k in row.fixed if k not in fields]
    if missing:
        return f"RunSpec has no field {', '.join(missing)} (issue 38 items 2-3 not on this branch)"
    if row.unless and row.unless in fields:
        return f"retired: RunSpec.{row.unless} exists, the rows above cover it"
    return None


def testbed_for(cluster: str, workload: str, steps: int | None = None, fraction: float | None = None):
    """The preset, at `steps` sampling steps and a trained fraction (None: the preset's own)."""
    path = TESTBEDS / f"paper-{cluster}-{workload}.yaml"
    if steps is None:
        return load_testbed(path)
    trained = int(round(steps * fraction, 9))
    return load_testbed(path, name=f"paper-{cluster}-{workload}-s{steps}-f{fraction}", denoise_steps=steps,
                        trained_steps=trained)


def _speedup(r, b) -> tuple[float, str]:
    """(ratio, basis): throughput, or per dollar when the two ran on different clusters."""
    if r.testbed != b.testbed:
        return r.samples_per_usd / b.samples_per_usd, "per $"
    return r.throughput / b.throughput, "throughput"


def ablate(tb, cm=None, steps: int = PLAN_STEPS) -> dict:
    """Every row on `tb`: {"testbed", "rows": [{label, mode, run, ...}], "not_run": {label: why}}."""
    cm = cm or default_cost_model()
    t0 = time.perf_counter()
    sim_modes = tuple(dict.fromkeys([r.mode for r in ABLATION if r.mode != "digenrl"] + list(BASELINE_ROWS)))
    rep = simulate(tb, modes=sim_modes, steps=steps, cm=cm)
    results, not_run, plans = {}, dict(rep.unfit), {}
    for row in ABLATION:
        why = runnable(row)
        if why:
            not_run[row.label] = why
            continue
        if row.mode in rep.rows and not row.fixed:
            results[row.label] = rep.rows[row.mode]
            continue
        if row.mode in rep.unfit:
            not_run[row.label] = rep.unfit[row.mode]
            continue
        key = (row.mode, tuple(sorted(row.fixed.items())))
        if key not in plans:  # the best plan with the row's fields fixed, searched from the rungs below too
            seeds = tuple(r.spec.knobs() for r in results.values())
            try:
                plans[key] = plan(tb, mode=row.mode, steps=steps, cm=cm, fixed=row.fixed or None,
                                  extra_starts=seeds).spec
            except ValueError as e:
                plans[key] = str(e)
        spec = plans[key]
        if isinstance(spec, str):
            not_run[row.label] = spec
            continue
        results[row.label] = run_spec(tb, spec, steps, cm)
    over_memory = set()
    for label in BASELINE_ROWS:
        if label in rep.rows:
            results[label] = rep.rows[label]
        elif label in VS:  # a peer whose shipped layout our memory model says does not fit: run it anyway
            where = rep.reference or tb
            try:
                spec = plan(where, mode="colocated", style=label, steps=steps, cm=cm, check_memory=False).spec
                results[label] = run_spec(where, spec, steps, cm, check_memory=False)
                over_memory.add(label)
            except ValueError as e:
                not_run[label] = f"{not_run.get(label, '')}; unchecked run failed too: {e}"
    rows = []
    for label, r in results.items():
        d = {"label": label, "mode": r.spec.mode, "style": r.spec.style, "cluster": r.testbed, "n_gpus": r.n_gpus,
             "memory_checked": label not in over_memory, "unfit": not_run.pop(label, None) if label in over_memory else None,
             "step_s": r.step_s, "samples_per_s": r.throughput, "samples_per_usd": r.samples_per_usd,
             "usd_per_hour": r.usd_per_hour, "utilisation": rep.ideal_s[r.testbed] / r.step_s,
             "staleness_max": r.staleness_max, "bubble": r.bubble, "knobs": r.spec.knobs()}
        for base in VS:
            if base in results:
                d[f"x_{base}"], d[f"x_{base}_basis"] = _speedup(r, results[base])
        rows.append(d)
    return {"testbed": tb.name, "model": tb.model, "n_gpus": tb.n_gpus,
            "pools": [f"{p.count}x {p.device} ({p.role})" for p in tb.pools],
            "denoise_steps": tb.denoise_steps, "trained_steps": tb.trained_steps,
            "samples_per_step": tb.samples_per_step, "ideal_step_s": rep.ideal_s,
            "reference": rep.reference.name if rep.reference else None, "sim_steps": steps,
            "rows": rows, "not_run": not_run, "wall_s": time.perf_counter() - t0}


def markdown(res: dict) -> str:
    out = [f"### {res['testbed']}: {res['model']}, {', '.join(res['pools'])}; {res['denoise_steps']} steps, "
           f"{res['trained_steps']} trained, {res['samples_per_step']} samples/step",
           "", "| row | mode | s/step | samples/s | % of ideal | x veRL-Omni | x GenRL | stale max |",
           "|---|---|---|---|---|---|---|---|"]
    for d in res["rows"]:
        xs = []
        for base in VS:
            x = d.get(f"x_{base}")
            xs.append("-" if x is None else f"{x:.2f}" + (" (per $)" if d[f"x_{base}_basis"] == "per $" else ""))
        label = d["label"] + ("" if d["memory_checked"] else " (over memory*)")
        out.append(f"| {label} | {d['mode']}{'/' + d['style'] if d['style'] else ''} | {d['step_s']:.2f} "
                   f"| {d['samples_per_s']:.3f} | {100 * d['utilisation']:.0f}% | {xs[0]} | {xs[1]} "
                   f"| {d['staleness_max']} |")
    for label, why in res["not_run"].items():
        out.append(f"| {label} | not run: {why} | | | | | | |")
    for d in res["rows"]:
        if not d["memory_checked"]:
            out.append(f"\n*{d['label']}: {d['unfit']}; simulated without the memory check (as the paper ran it "
                       "there), so its speedups are against a layout our memory model says does not fit.")
    if res["reference"]:
        out.append(f"\nColocated rows ran on {res['reference']} (same hourly budget); their speedups are per dollar.")
    return "\n".join(out)


def summary(results: list[dict]) -> str:
    """The top on-policy rung and the top rung of each run, against the paper's range."""
    lines = [f"| testbed | top on-policy rung | x veRL-Omni | x GenRL | top rung | x veRL-Omni | x GenRL | "
             f"paper {PAPER[0]}-{PAPER[1]}x |", "|---|---|---|---|---|---|---|---|"]
    for res in results:
        ladder = [d for d in res["rows"] if d["label"] not in BASELINE_ROWS]
        on_policy = [d for d in ladder if d["staleness_max"] == 0]
        cells = []
        for d in (on_policy[-1] if on_policy else None, ladder[-1] if ladder else None):
            if d is None:
                cells += ["-", "-", "-"]
                continue
            cells += [d["label"]] + [f"{d[f'x_{b}']:.2f}" if d.get(f"x_{b}") is not None else "-" for b in VS]
        top = ladder[-1] if ladder else {}
        xs = [top.get(f"x_{b}") for b in VS]
        within = "-" if None in xs else ("within" if all(PAPER[0] <= x <= PAPER[1] for x in xs) else
                                         "below" if max(xs) < PAPER[0] else "above" if min(xs) > PAPER[1] else "mixed")
        lines.append(f"| {res['testbed']} | " + " | ".join(cells) + f" | {within} |")
    return "\n".join(lines)


def compact(results: list[dict]) -> str:
    """One line per run: samples/s of every row, then the top rung's speedups (docs/measurements/simulator.md)."""
    labels = list(dict.fromkeys(d["label"] for res in results for d in res["rows"]))
    lines = ["| testbed | " + " | ".join(labels) + " | top rung x veRL-Omni | x GenRL |",
             "|---|" + "---|" * (len(labels) + 2)]
    for res in results:
        by = {d["label"]: d for d in res["rows"]}
        cells = [("-" if l not in by else f"{by[l]['samples_per_s']:.3f}" + ("*" if not by[l]["memory_checked"] else ""))
                 for l in labels]
        ladder = [d for d in res["rows"] if d["label"] not in BASELINE_ROWS]
        top = ladder[-1] if ladder else {}
        xs = [("-" if top.get(f"x_{b}") is None else
               f"{top[f'x_{b}']:.2f}" + (" per $" if top[f"x_{b}_basis"] == "per $" else "")) for b in VS]
        lines.append(f"| {res['testbed']} | " + " | ".join(cells) + f" | {xs[0]} | {xs[1]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"one testbed x one workload: {QUICK}")
    ap.add_argument("--clusters", default=",".join(CLUSTERS), help=f"of {CLUSTERS}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {WORKLOADS}")
    ap.add_argument("--sweep", action="store_true",
                    help=f"every (steps, fraction) of {STEPS} x {FRACTIONS}, not only the presets' (20, 0.6)")
    ap.add_argument("--json", default="paper_ablation.json", help="where to write every number")
    a = ap.parse_args(argv)
    clusters, workloads = ([QUICK[0]], [QUICK[1]]) if a.quick else (a.clusters.split(","), a.workloads.split(","))
    settings = [(s, f) for s in STEPS for f in FRACTIONS] if a.sweep else [(None, None)]
    for row in ABLATION:
        why = runnable(row)
        if why:
            print(f"note: row {row.label!r} not run: {why}", file=sys.stderr)
    t0 = time.perf_counter()
    cm = default_cost_model()
    results = []
    for c in clusters:
        for w in workloads:
            for s, f in settings:
                res = ablate(testbed_for(c, w, s, f), cm)
                results.append(res)
                print(markdown(res), f"\n({res['wall_s']:.0f} s)\n", flush=True)
    print("### Summary\n")
    print(summary(results))
    print("\n### Samples per second, every row\n")
    print(compact(results))
    wall = time.perf_counter() - t0
    print(f"\n{len(results)} testbed x workload runs in {wall:.0f} s wall")
    Path(a.json).write_text(json.dumps({"paper_speedup": PAPER, "ablation": [dataclasses.asdict(r) for r in ABLATION],
                                        "results": results, "wall_s": wall}, indent=1, default=float))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

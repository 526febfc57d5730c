"""Traces of who ran what when, and the metrics a run is measured by
(docs/simulator.md, "What each number means").

A Trace is a list of Spans (worker, kind, start, end, version, step, extra) plus the
pools and each worker's alive interval. Both clocks produce it: the simulator (virtual
seconds) and the runtime (wall seconds). Metrics:

    bubble_ratios     per pool: idle worker-time / total worker-time over a window
    staleness         per RL step: max (trainer version - trajectory version) trained
    step_breakdown    per RL step: wall milestones and worker-seconds per unit kind

Span.version is the weights a unit ran with (Train: the trainer's; Generate: the
trajectory's; OptimizerStep/WeightSync: the version produced/loaded). Span.step of a
WeightSync(v) is v - 1, the step whose optimizer produced v.

Exports: `write_chrome_trace` (Perfetto / chrome://tracing; one process per pool, one
thread per worker) and `plot_gantt` (matplotlib, imported lazily).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

POOLS = ("rollout", "trainer", "reward", "colocated")
COLORS = {"generate": "#4C72B0", "reward": "#DD8452", "train": "#55A868",
          "optimizer": "#C44E52", "sync": "#8172B3"}


@dataclass(slots=True)
class Span:
    worker: str
    kind: str
    start: float
    end: float
    version: Optional[int]
    step: Optional[int]
    extra: Optional[dict] = None  # e.g. {"lost": True} for a unit cut short by a loss
    unit: object = None  # the scheduler unit, when known (kept by reference: no copy)


@dataclass
class Trace:
    spans: list[Span] = field(default_factory=list)
    workers: dict[str, str] = field(default_factory=dict)  # worker id -> pool
    alive: dict[str, list] = field(default_factory=dict)  # worker id -> [join, leave or None]
    end: float = 0.0
    n_events: int = 0


def pool_time(trace: Trace, pool: str, t0: float, t1: float) -> float:
    """Worker-time of `pool` over [t0, t1]: each worker from its join to its leave (or the end)."""
    total = 0.0
    for wid, role in trace.workers.items():
        if role == pool:
            join, leave = trace.alive[wid]
            total += max(0.0, min(t1, trace.end if leave is None else leave) - max(t0, join))
    return total


def bubble_ratio(trace: Trace, pool: str, t0: float = 0.0, t1: Optional[float] = None) -> float:
    """Idle worker-time / total worker-time of `pool` over [t0, t1] (default: whole run)."""
    t1 = trace.end if t1 is None else t1
    total = pool_time(trace, pool, t0, t1)
    if total <= 0:
        return 0.0
    busy = sum(max(0.0, min(s.end, t1) - max(s.start, t0))
               for s in trace.spans if trace.workers[s.worker] == pool)
    return max(0.0, 1.0 - busy / total)  # max(): float round-off on an idle-free pool


def bubble_ratios(trace: Trace, step: Optional[int] = None) -> dict[str, float]:
    """{pool: bubble ratio} over the whole run, or over one RL step's span."""
    t0, t1 = (0.0, trace.end) if step is None else step_spans(trace)[step]
    pools = [p for p in POOLS if p in trace.workers.values()]
    return {p: bubble_ratio(trace, p, t0, t1) for p in pools}


def step_spans(trace: Trace) -> dict[int, tuple[float, float]]:
    """RL step -> (first unit start, last unit end), weight syncs excluded."""
    out: dict[int, list] = {}
    for s in trace.spans:
        if s.step is None or s.kind == "sync":
            continue
        span = out.setdefault(s.step, [s.start, s.end])
        span[0], span[1] = min(span[0], s.start), max(span[1], s.end)
    return {k: (a, b) for k, (a, b) in sorted(out.items())}


def staleness(trace: Trace) -> dict[int, int]:
    """RL step -> max (trainer version - trajectory version) over its Train spans.

    The trajectory version comes from the span's Train unit, or extra["traj_version"].
    """
    out: dict[int, int] = {}
    for s in trace.spans:
        if s.kind == "train" and not (s.extra and s.extra.get("lost")):
            traj = s.unit.traj_version if s.unit is not None else s.extra["traj_version"]
            lag = s.version - traj
            out[s.step] = max(out.get(s.step, lag), lag)
    return dict(sorted(out.items()))


def step_breakdown(trace: Trace) -> dict[int, dict[str, float]]:
    """RL step -> wall milestones (seconds from the step's start) and worker-seconds per kind.

    Milestones: `span_s` (start -> optimizer end), `generate_done_s`, `train_done_s`.
    Worker-seconds: `<kind>_ws` summed over all workers (sync counted for its step).
    """
    spans = step_spans(trace)
    out = {k: {"start_s": a, "span_s": b - a} for k, (a, b) in spans.items()}
    for s in trace.spans:
        row = out.get(s.step)
        if row is None:
            continue
        key = s.kind + "_ws"
        row[key] = row.get(key, 0.0) + (s.end - s.start)
        if s.kind in ("generate", "train"):
            mk = s.kind + "_done_s"
            row[mk] = max(row.get(mk, 0.0), s.end - row["start_s"])
    return out


def write_chrome_trace(trace: Trace, path: str) -> None:
    """Chrome trace-event JSON: one process per pool, one thread per worker (seconds -> us);
    instant events `join` / `leave` mark each worker's alive interval (join at 0 omitted)."""
    pid = {p: i + 1 for i, p in enumerate(POOLS)}
    tid = {wid: i + 1 for i, wid in enumerate(trace.workers)}
    events = []
    for p in POOLS:
        if p in trace.workers.values():
            events.append({"ph": "M", "name": "process_name", "pid": pid[p], "args": {"name": p}})
    for wid, role in trace.workers.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid[role], "tid": tid[wid],
                       "args": {"name": wid}})
    for wid, (join, leave) in trace.alive.items():  # elastic pools and replacements: when each was there
        for name, t in (("join", join if join else None), ("leave", leave)):
            if t is not None and wid in tid:
                events.append({"ph": "i", "s": "t", "name": name, "cat": "pool", "pid": pid[trace.workers[wid]],
                               "tid": tid[wid], "ts": t * 1e6})
    for s in trace.spans:
        args = {"step": s.step, "version": s.version}
        if s.unit is not None:
            args["unit"] = repr(s.unit)
        if s.extra:
            args.update(s.extra)
        events.append({"ph": "X", "name": s.kind, "cat": s.kind,
                       "pid": pid[trace.workers[s.worker]], "tid": tid[s.worker], "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6,
                       "args": args})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def plot_gantt(trace: Trace, path: str, step: Optional[int] = None) -> None:
    """One row per worker (grouped by pool), bars coloured by unit kind; PNG/SVG by suffix."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    order = {w: i for i, w in enumerate(trace.workers)}
    rows = sorted(trace.workers, key=lambda w: (POOLS.index(trace.workers[w]), order[w]))
    row = {w: i for i, w in enumerate(rows)}
    bars: dict[tuple[str, str], list] = {}
    for s in trace.spans:
        if step is None or s.step == step:
            bars.setdefault((s.worker, s.kind), []).append((s.start, s.end - s.start))
    fig, ax = plt.subplots(figsize=(12, 1 + 0.25 * len(rows)))
    for (wid, k), xs in bars.items():
        ax.broken_barh(xs, (row[wid] - 0.4, 0.8), facecolors=COLORS.get(k, "grey"))
    ax.set_yticks(range(len(rows)), [f"{trace.workers[w]}:{w}" for w in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("all steps" if step is None else f"RL step {step}")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="upper right",
              fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

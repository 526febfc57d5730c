"""Traces of who ran what when, and the metrics a run is measured by
(docs/guides/planning.md, "What each number means").

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

On disk (`TraceLog`, the Ray driver's trace): `trace.jsonl`, one JSON object per line in
the order things happened, each line flushed as it is written, so a run that dies leaves
every span that finished:

    {"join": wid, "pool": role, "t": s}      a worker joined (t 0: there from the start)
    {"leave": wid, "t": s}                    it left the pools (drained) or died
    {"worker": .., "kind": .., "start": .., "end": .., "version": .., "step": ..,
     "unit": {fields}, "extra": {..}}        a span ("unit" and "extra" when it has them)
    {"end": s, "n_events": n}                 the run's end (absent: it stopped mid-way)

`read_trace` turns it back into a Trace (the units rebuilt); `build_outputs` writes
trace.json and gantt.png from it with memory for the workers, not the spans.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

from digenrl.sched.units import KINDS

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
    stopped: bool = False  # the run ended before its last step (sim.engine.run_virtual: on_version, until_synced)

    # What the event loop records, through these so a TraceLog can write it as it comes.
    def add(self, span: Span) -> None:
        self.spans.append(span)

    def join(self, wid: str, pool: str, t: float) -> None:
        self.workers[wid] = pool
        self.alive[wid] = [t, None]

    def leave(self, wid: str, t: float) -> None:
        self.alive[wid][1] = t

    def release(self, before: float) -> None:
        """No window starting before `before` will be asked for (a TraceLog forgets the spans
        that ended by then); an in-memory Trace keeps every span."""

    def finish(self, end: float) -> None:
        self.end = end


class TraceLog(Trace):
    """A Trace streamed to `path` (trace.jsonl, format in the module doc) as it is made.

    In memory: the workers, their alive intervals, and in `spans` only the window, the spans
    that end after the latest `release(before)`: the event loop releases at each RL step's
    end, so bubble ratios over [previous step end, now] (RealBackend.step_done) are the
    same numbers an in-memory Trace gives (a dropped span overlaps that window by 0 s).
    """

    def __init__(self, path):
        super().__init__()
        self.path = Path(path)
        self._file = open(self.path, "w", buffering=1)  # line-buffered: each record reaches the OS whole

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def add(self, span: Span) -> None:
        self._write(span_record(span))
        self.spans.append(span)

    def join(self, wid: str, pool: str, t: float) -> None:
        super().join(wid, pool, t)
        self._write({"join": wid, "pool": pool, "t": t})

    def leave(self, wid: str, t: float) -> None:
        super().leave(wid, t)
        self._write({"leave": wid, "t": t})

    def release(self, before: float) -> None:
        self.spans = [s for s in self.spans if s.end > before]

    def finish(self, end: float) -> None:
        super().finish(end)
        self._write({"end": end, "n_events": self.n_events})

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "TraceLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_UNIT_TYPES = {name: cls for cls, name in KINDS.items()}


def span_record(s: Span) -> dict:
    """One trace.jsonl line of span `s` (its unit as its fields: tuples become lists)."""
    rec = {"worker": s.worker, "kind": s.kind, "start": s.start, "end": s.end, "version": s.version,
           "step": s.step}
    if s.unit is not None:
        rec["unit"] = {f.name: getattr(s.unit, f.name) for f in dataclasses.fields(s.unit)}
    if s.extra:
        rec["extra"] = s.extra
    return rec


def span_from_record(rec: dict) -> Span:
    unit = rec.get("unit")
    if unit is not None:  # every list-valued unit field is a tuple (groups, t_steps, samples)
        unit = _UNIT_TYPES[rec["kind"]](**{k: tuple(v) if isinstance(v, list) else v for k, v in unit.items()})
    return Span(rec["worker"], rec["kind"], rec["start"], rec["end"], rec["version"], rec["step"],
                rec.get("extra"), unit)


def _records(path) -> Iterator[dict]:
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):  # a run killed mid-write leaves a last line cut short
                yield json.loads(line)


def read_trace(path, steps: Optional[tuple[int, int]] = None, spans: bool = True) -> Trace:
    """The Trace in trace.jsonl `path`: every span, or those of RL steps [a, b) (`steps`), or
    none (`spans=False`: workers, alive intervals and the end only). A run that stopped
    mid-way (no end record) ends at its last span's end."""
    tr, last, ended = Trace(), 0.0, False
    for rec in _records(path):
        if "join" in rec:
            tr.join(rec["join"], rec["pool"], rec["t"])
        elif "leave" in rec:
            tr.leave(rec["leave"], rec["t"])
        elif "n_events" in rec:  # the end record
            tr.end, tr.n_events, ended = rec["end"], rec["n_events"], True
        else:
            last = max(last, rec["end"])
            if spans and (steps is None or (rec["step"] is not None and steps[0] <= rec["step"] < steps[1])):
                tr.spans.append(span_from_record(rec))
    if not ended:
        tr.end = last
    return tr


def iter_spans(path) -> Iterator[Span]:
    """The spans of trace.jsonl `path`, one at a time (nothing kept)."""
    for rec in _records(path):
        if "worker" in rec:
            yield span_from_record(rec)


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
    _write_chrome(trace.workers, trace.alive, trace.spans, path)


def _write_chrome(workers: dict[str, str], alive: dict[str, list], spans: Iterable[Span], path) -> None:
    """write_chrome_trace's file, its events written one at a time (`spans` may be a stream):
    the same bytes as json.dump of the whole {"traceEvents": [...], ...} object."""
    with open(path, "w") as f:
        f.write('{"traceEvents": [')
        for i, e in enumerate(_chrome_events(workers, alive, spans)):
            f.write((", " if i else "") + json.dumps(e))
        f.write('], "displayTimeUnit": "ms"}')


def _chrome_events(workers: dict[str, str], alive: dict[str, list], spans: Iterable[Span]) -> Iterator[dict]:
    pid = {p: i + 1 for i, p in enumerate(POOLS)}
    tid = {wid: i + 1 for i, wid in enumerate(workers)}
    for p in POOLS:
        if p in workers.values():
            yield {"ph": "M", "name": "process_name", "pid": pid[p], "args": {"name": p}}
    for wid, role in workers.items():
        yield {"ph": "M", "name": "thread_name", "pid": pid[role], "tid": tid[wid], "args": {"name": wid}}
    for wid, (join, leave) in alive.items():  # elastic pools and replacements: when each was there
        for name, t in (("join", join if join else None), ("leave", leave)):
            if t is not None and wid in tid:
                yield {"ph": "i", "s": "t", "name": name, "cat": "pool", "pid": pid[workers[wid]],
                       "tid": tid[wid], "ts": t * 1e6}
    for s in spans:
        args = {"step": s.step, "version": s.version}
        if s.unit is not None:
            args["unit"] = repr(s.unit)
        if s.extra:
            args.update(s.extra)
        yield {"ph": "X", "name": s.kind, "cat": s.kind, "pid": pid[workers[s.worker]], "tid": tid[s.worker],
               "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6, "args": args}


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


# Gantt charts of more steps than this are unreadable (and would hold every bar in memory).
GANTT_STEPS = 100


def build_outputs(log: str | Path, out_dir: str | Path, steps: Optional[tuple[int, int]] = None) -> dict[str, str]:
    """trace.json and gantt.png in `out_dir` from trace.jsonl `log`, holding the workers in
    memory, not the spans. trace.json: every span, or those of RL steps [a, b); gantt.png:
    those steps, or the last GANTT_STEPS of the run. Returns {"trace": path, "gantt": path}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head = read_trace(log, spans=False)
    keep = (lambda s: True) if steps is None else (lambda s: s.step is not None and steps[0] <= s.step < steps[1])
    trace_json, gantt = out_dir / "trace.json", out_dir / "gantt.png"
    _write_chrome(head.workers, head.alive, (s for s in iter_spans(log) if keep(s)), trace_json)
    if steps is None:
        last = max((s.step for s in iter_spans(log) if s.step is not None), default=0)
        steps = (last + 1 - GANTT_STEPS, last + 1)
    plot_gantt(read_trace(log, steps=steps), str(gantt))
    return {"trace": str(trace_json), "gantt": str(gantt)}

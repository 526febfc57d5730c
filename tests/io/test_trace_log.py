"""trace.jsonl (io/trace.py TraceLog): the streamed trace gives the numbers the in-memory one
gives. A simulated run with lost and joining workers is replayed event by event, as the
runtime's event loop records it (joins, leaves, each span when it ends, a step's end after
its last OptimizerStep); at each step end the per-step bubble ratios the driver logs
(RealBackend.step_done) are computed from the TraceLog's window and from the whole trace,
units in flight included, and must be equal, not close. Every third span reaches the driver
before its end (a worker whose clock runs behind the driver's, as on another node): the
window must keep it past the step end, for the next step's share."""

import json
import random

import pytest

from digenrl.io.trace import (Span, Trace, TraceLog, bubble_ratio, bubble_ratios, build_outputs, read_trace,
                              staleness, step_breakdown, write_chrome_trace)
from digenrl.sim.engine import run_virtual
from digenrl.sched import Scheduler, SchedConfig, Worker

from tests.sched.sched_helpers import const_cost, random_losses


@pytest.fixture(scope="module")
def simulated():
    """A digenrl run (TCSS: steps overlap) with rollout and reward workers lost and joining."""
    failures, joins = random_losses(random.Random(3))
    c = SchedConfig(mode="digenrl", tcss=True, rl_steps=6, groups_per_step=8, micro_batch_groups=2, num_steps=6,
                    rollout_segment=2, tsp_chunk=2)
    workers = [Worker(f"r{i}", "rollout") for i in range(4)] + [Worker(f"t{i}", "trainer") for i in range(2)] \
        + [Worker(f"w{i}", "reward") for i in range(2)]
    cost = {"generate": 1.0, "reward": 0.5, "train": 0.1, "optimizer": 0.5, "sync": 0.5}  # rollout-bound:
    return run_virtual(Scheduler(c, workers), const_cost(cost), failures=failures, joins=joins)  # units straddle step ends


def _events(tr: Trace) -> list:
    """(time, order, what, arg) in the order the event loop would record them."""
    ev = [(t, 0, "join", w) for w, (t, _) in tr.alive.items()]
    ev += [(t, 1, "leave", w) for w, (_, t) in tr.alive.items() if t is not None]
    ev += [(s.end - ((s.end - s.start) / 2 if i % 3 == 0 else 0.0), 2, "span", s)
           for i, s in enumerate(tr.spans)]  # clock skew: see the module doc
    opt_ends = {}
    for s in tr.spans:
        if s.kind == "optimizer" and not (s.extra and s.extra.get("lost")):
            opt_ends[s.step] = max(opt_ends.get(s.step, 0.0), s.end)
    ev += [(t, 3, "step_done", k) for k, t in opt_ends.items()]
    return sorted(ev, key=lambda e: (e[0], e[1]))


def _replay(tr: Trace, log: TraceLog) -> tuple[Trace, list, int]:
    """Feed `tr`'s events to `log` and to an in-memory Trace; at each step end, the per-pool
    bubble ratios over [previous step end, now] from each. Returns (the in-memory Trace,
    [(step, from the log's window, from the whole trace)], spans the window kept past a
    step end)."""
    full, out, last_end, added, kept = Trace(), [], 0.0, set(), 0
    for t, _, what, arg in _events(tr):
        if what == "join":
            for rec in (full, log):
                rec.join(arg, tr.workers[arg], t)
        elif what == "leave":
            for rec in (full, log):
                rec.leave(arg, t)
        elif what == "span":
            added.add(id(arg))
            for rec in (full, log):
                rec.add(arg)
        else:  # the loop's live_trace(): units in flight as spans up to now
            flying = [Span(s.worker, s.kind, s.start, t, None, None) for s in tr.spans
                      if s.start < t and id(s) not in added]
            got = [bubble_ratio(Trace(rec.spans + flying, rec.workers, rec.alive, t), p, last_end, t)
                   for rec in (log, full) for p in ("rollout", "trainer", "reward")]
            out.append((arg, got[:3], got[3:]))
            log.release(t)
            kept += len(log.spans)
            last_end = t
    for rec in (full, log):
        rec.finish(tr.end)
    return full, out, kept


def test_streamed_step_bubbles_equal_the_whole_trace(simulated, tmp_path):
    with TraceLog(tmp_path / "trace.jsonl") as log:
        full, per_step, kept = _replay(simulated, log)
        assert len(log.spans) < len(full.spans) / 3  # the window, not the run
    assert [k for k, _, _ in per_step] == list(range(6))
    for k, streamed, whole in per_step:
        assert streamed == whole, k
    assert any(0 < b < 1 for _, b, _ in per_step for b in b)  # real windows, not all-idle ones
    assert kept > 0  # spans that end after a step's end (skew) stayed for the next window


def test_read_back_is_the_trace_and_its_metrics(simulated, tmp_path):
    path = tmp_path / "trace.jsonl"
    with TraceLog(path) as log:
        full, _, _ = _replay(simulated, log)
    back = read_trace(path)
    assert back.spans == full.spans  # units rebuilt: tuples, None samples, lost / extra marks
    assert (back.workers, back.alive, back.end) == (full.workers, full.alive, full.end)
    assert any(s.extra and s.extra.get("lost") for s in back.spans) and len(back.workers) > 8  # losses, joins
    assert staleness(back) == staleness(full) and step_breakdown(back) == step_breakdown(full)
    assert bubble_ratios(back) == bubble_ratios(full) and bubble_ratios(back, 2) == bubble_ratios(full, 2)
    assert [s.step for s in read_trace(path, steps=(2, 4)).spans] == [s.step for s in full.spans if s.step in (2, 3)]


def test_outputs_from_the_file_are_the_in_memory_ones(simulated, tmp_path):
    path = tmp_path / "trace.jsonl"
    with TraceLog(path) as log:
        full, _, _ = _replay(simulated, log)
    write_chrome_trace(full, str(tmp_path / "whole.json"))
    out = build_outputs(path, tmp_path)
    assert (tmp_path / "trace.json").read_bytes() == (tmp_path / "whole.json").read_bytes()
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]  # valid JSON
    assert out["gantt"].endswith("gantt.png") and (tmp_path / "gantt.png").stat().st_size > 0
    build_outputs(path, tmp_path, steps=(1, 2))  # on request: one step
    xs = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert xs and {e["args"]["step"] for e in xs} == {1}


def test_a_run_that_stopped_leaves_every_finished_span(simulated, tmp_path):
    """Killed mid-run: the file is never closed, its last line may be cut short; what was
    written reads back (the end: the last span's)."""
    path = tmp_path / "trace.jsonl"
    log = TraceLog(path)
    for w, (t, _) in simulated.alive.items():
        log.join(w, simulated.workers[w], t)
    for s in simulated.spans[:20]:
        log.add(s)  # not closed: each line is flushed as it is written
    with open(path, "a") as f:
        f.write('{"worker": "r0", "kind": "gen')  # a write cut short by the kill
    back = read_trace(path)
    assert back.spans == simulated.spans[:20]
    assert back.end == max(s.end for s in simulated.spans[:20])
    log.close()


def test_cli_builds_them_on_request(simulated, tmp_path, capsys):
    from digenrl.tools.cli import main

    assert main(["trace", "--run-dir", str(tmp_path)]) == 2  # no trace.jsonl: says so
    assert "trace.jsonl" in capsys.readouterr().err
    with TraceLog(tmp_path / "trace.jsonl") as log:
        _replay(simulated, log)
    assert main(["trace", "--run-dir", str(tmp_path), "--steps", "3"]) == 2
    assert main(["trace", "--run-dir", str(tmp_path), "--steps", "3:5", "--out", str(tmp_path / "o")]) == 0
    xs = [e for e in json.loads((tmp_path / "o" / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["args"]["step"] for e in xs} == {3, 4} and (tmp_path / "o" / "gantt.png").exists()

"""Spot rollout workers: the provider's notice, a drain before the deadline, a kill past it.

    NoticeSource.poll(now_s) -> [Notice | Join]     (sched.preemption events, on the run's clock:
                                                     the event loop's seconds; emulated runs:
                                                     modelled seconds)
      TraceNotices  a sched.preemption trace (runtime.rollout.preemptions): emulated runs, chaos
      FileNotices   DIR/<worker id> appears (runtime.rollout.notices, default RUN_DIR/notices);
                    its content gives the deadline (`parse_notice`)
      SIGTERM       to a worker's process: its handler (`arm_sigterm`, installed in every
                    preemptible rollout actor) writes DIR/<worker id>, which FileNotices reads

    Preemption.poll(loop), from EventLoop's poll (every batch of completions, and every poll_s):
      Notice    Scheduler.drain(worker): it gets no new unit; its unit in flight completes, or its
                trajectory is handed over at the next denoising-step boundary; then it leaves and
                its actors are stopped (the elastic path, runtime/elastic.py)
      deadline  still in the pools: its actors are killed. The loop sees the unit in flight fail
                and handles it as a lost node's (Scheduler.worker_lost: its micro-batch is
                regenerated, nothing trained twice). A worker that was draining gets no
                replacement: the provider's replacement is a Join
      Join      a rollout worker starts and joins (its first unit syncs the current weights)

Ray's own SIGTERM handler makes a worker process exit at once (ray/_private/worker.py,
main_loop), so without `arm_sigterm` a notice delivered as SIGTERM loses the unit in flight.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Protocol, Union

from digenrl.sched import SchedulerError
from digenrl.sched.preemption import Event, Join, Notice

if TYPE_CHECKING:
    from digenrl.runtime.loop import EventLoop

log = logging.getLogger(__name__)


class NoticeSource(Protocol):
    """Where the provider's reclaim notices come from."""

    def poll(self, now_s: float) -> list[Event]:
        """The notices (and replacements) due by `now_s` on the run's clock, each returned once."""


class TraceNotices:
    """The events of a sched.preemption trace (or `draw`), each once its `at_s` has come."""

    def __init__(self, events: Iterable[Event]):
        self.events = sorted(events, key=lambda e: (e.at_s, isinstance(e, Join), e.worker))
        self._next = 0

    def next_at(self) -> Optional[float]:
        """When the next event is due (None: none left)."""
        return self.events[self._next].at_s if self._next < len(self.events) else None

    def poll(self, now_s: float) -> list[Event]:
        start = self._next
        while self._next < len(self.events) and self.events[self._next].at_s <= now_s:
            self._next += 1
        return self.events[start:self._next]


def parse_notice(text: str, default_s: float, now_unix: float) -> float:
    """Seconds from now to the deadline that a notice file's `text` gives.

    Empty, or GCE's metadata answer `TRUE`: `default_s`. A number: seconds. A JSON object
    with `notice_s` (seconds), or with `time` (ISO 8601, as in AWS's spot instance-action
    document {"action": "terminate", "time": "2026-12-02T08:22:00Z"}): that. ValueError otherwise.
    """
    text = text.strip()
    if text == "" or text.upper() == "TRUE":
        return default_s
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"a notice is empty, TRUE, a number of seconds or a JSON object; got {text[:80]!r}") \
            from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, dict) and "notice_s" in value:
        seconds = float(value["notice_s"])
    elif isinstance(value, dict) and "time" in value:
        at = datetime.fromisoformat(str(value["time"]).replace("Z", "+00:00"))
        if at.tzinfo is None:
            at = at.replace(tzinfo=timezone.utc)
        seconds = at.timestamp() - now_unix
    else:
        raise ValueError(f"a JSON notice has notice_s or time (ISO 8601); got {text[:80]!r}")
    if not math.isfinite(seconds):
        raise ValueError(f"a notice's deadline must be finite; got {text[:80]!r}")
    return max(0.0, seconds)


class FileNotices:
    """A file named after a worker appearing in `directory` is that worker's notice.

    Its content gives the deadline (`parse_notice`); a file that does not parse gives
    `default_s` (and a warning): a notice is never ignored. Names starting with '.' are
    skipped (write a notice as .tmp, then rename it: `write_notice`), and so are files that
    were there when the source was made (an earlier run's), until one is written again (a
    new modification time: a resumed run's worker of the same id noticed anew). `now_unix`:
    the wall clock (tests inject one).
    """

    def __init__(self, directory: Union[str, Path], default_s: float, now_unix: Callable[[], float] = time.time):
        self.dir, self.default_s, self.now_unix = Path(directory), default_s, now_unix
        # files already there are an earlier run's (a resumed run reuses worker ids): not notices
        self.seen: dict[str, int] = {n: self._mtime(n) for n in self._names()}  # name -> mtime taken
        if self.seen:
            log.warning("notices directory %s already holds %s: taken as an earlier run's, not as notices",
                        self.dir, sorted(self.seen))

    def _names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.dir) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def _mtime(self, name: str) -> int:
        try:
            return os.stat(self.dir / name).st_mtime_ns
        except OSError:
            return -1

    def poll(self, now_s: float) -> list[Event]:
        out: list[Event] = []
        for name in self._names():
            mtime = self._mtime(name)
            if self.seen.get(name) == mtime:
                continue
            self.seen[name] = mtime
            try:
                text = (self.dir / name).read_text()
                left = parse_notice(text, self.default_s, self.now_unix())
            except (OSError, ValueError) as e:
                log.warning("notice file %s: %s; taking the default deadline, %g s", self.dir / name, e, self.default_s)
                left = self.default_s
            out.append(Notice(now_s, name, left))
        return out


def write_notice(directory: Union[str, Path], worker_id: str, notice: dict) -> Path:
    """Write `notice` (JSON) as DIR/<worker_id>, atomically (a reader never sees half of it)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / worker_id
    tmp = directory / f".{worker_id}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(notice))
    os.replace(tmp, path)
    return path


def arm_sigterm(directory: Union[str, Path], worker_id: Callable[[], str], notice_s: float) -> None:
    """In a worker's process (its main thread, where Ray runs actor methods): SIGTERM writes
    the worker's notice, deadline `notice_s` from the signal, instead of exiting at once.
    The process keeps working until the driver stops it (drained) or kills it (deadline)."""

    def on_sigterm(signum, frame):
        deadline = datetime.now(timezone.utc) + timedelta(seconds=notice_s)
        write_notice(directory, worker_id(), {"time": deadline.isoformat(), "signal": "SIGTERM"})

    signal.signal(signal.SIGTERM, on_sigterm)


def spot_sources(cfg) -> list:
    """The notice sources of a run with runtime.rollout.preemptible: notice files (which
    SIGTERM writes too), and the runtime.rollout.preemptions trace when one is given."""
    from digenrl.sched.preemption import read_trace

    pool = cfg.runtime.rollout
    sources: list = [FileNotices(notice_dir(cfg), pool.notice_s)]
    if pool.preemptions:
        sources.append(TraceNotices(read_trace(pool.preemptions)))
    return sources


def notice_dir(cfg) -> Path:
    """Where file and SIGTERM notices of the run `cfg` go: runtime.rollout.notices, else
    RUN_DIR/notices (the run directory is on storage every node sees)."""
    given = cfg.runtime.rollout.notices
    return Path(given) if given else Path(cfg.run.run_dir) / "notices"


@dataclass
class Preemption:
    """The driver's side of spot rollout workers; `poll` is an EventLoop poll (module doc).

    sources: where notices come from. clock(loop): the run's clock, in the sources' seconds.
    kill(worker_id): stop that worker's actors now (its unit in flight is lost). add(join,
    loop): start the worker a Join brings and `loop.join` it once up (None: joins are logged
    only; the autoscaler brings capacity instead). The runner that owns the backend fills in
    the ones left None (run_scheduler_emulated, RayDriver).
    """

    sources: list
    clock: Optional[Callable[["EventLoop"], float]] = None
    kill: Optional[Callable[[str], None]] = None
    add: Optional[Callable[[Join, "EventLoop"], None]] = None
    deadlines: dict[str, float] = field(default_factory=dict)  # noticed workers still in the pools
    log: list[dict] = field(default_factory=list)  # one record per notice, join and kill
    stats: dict[str, int] = field(default_factory=lambda: {
        "notices": 0, "honoured": 0, "killed": 0, "refused": 0, "ignored": 0, "joins": 0})

    def poll(self, loop: "EventLoop") -> None:
        now = self.clock(loop)
        for source in self.sources:
            for event in source.poll(now):
                if isinstance(event, Join):
                    self._join(event, loop, now)
                else:
                    self._notice(event, loop, now)
        present = {w.id for w in loop.sched.workers}
        for wid, deadline in list(self.deadlines.items()):
            if wid not in present:  # drained and gone before its deadline
                del self.deadlines[wid]
                self.stats["honoured"] += 1
            elif now >= deadline:
                del self.deadlines[wid]
                self.stats["killed"] += 1
                unit = loop.sched.in_flight.get(wid)
                self.log.append({"event": "kill", "at_s": now, "worker": wid, "deadline_s": deadline,
                                 "busy": unit is not None, "unit": repr(unit) if unit is not None else None})
                log.warning("spot worker %s still working at its deadline (%.1f s): killed, its work regenerated",
                            wid, deadline)
                self.kill(wid)

    def next_at(self) -> Optional[float]:
        """The next time on the run's clock at which `poll` acts: a deadline, or a source's next
        event (sources that know it ahead: TraceNotices). None: nothing known ahead."""
        times = list(self.deadlines.values())
        times += [t for src in self.sources if hasattr(src, "next_at") and (t := src.next_at()) is not None]
        return min(times, default=None)

    def finish(self, loop: "EventLoop") -> dict[str, int]:
        """After the run: noticed workers that left count as honoured; the rest as pending."""
        present = {w.id for w in loop.sched.workers}
        gone = [w for w in self.deadlines if w not in present]
        self.stats["honoured"] += len(gone)
        self.stats["pending"] = len(self.deadlines) - len(gone)
        self.deadlines.clear()
        return dict(self.stats)

    def _notice(self, notice: Notice, loop: "EventLoop", now: float) -> None:
        ws = {w.id: w for w in loop.sched.workers}
        wid = notice.worker
        rec = {"event": "notice", "at_s": now, "worker": wid, "deadline_s": now + notice.notice_s}
        if ws.get(wid) is None or ws[wid].role != "rollout" or wid in self.deadlines:
            rec["ignored"] = "not a rollout worker in the pools" if wid not in self.deadlines else "noticed before"
            self.stats["ignored"] += 1
            self.log.append(rec)
            return
        self.stats["notices"] += 1
        self.deadlines[wid] = now + notice.notice_s
        try:
            loop.drain(wid)
        except SchedulerError as e:  # the last rollout worker of a mode without TAG
            rec["refused"] = str(e)
            self.stats["refused"] += 1
            log.warning("spot worker %s noticed but not drained (%s): it works until its deadline", wid, e)
        self.log.append(rec)

    def _join(self, join: Join, loop: "EventLoop", now: float) -> None:
        self.log.append({"event": "join", "at_s": now, "worker": join.worker, "replaces": join.replaces})
        if self.add is not None:
            self.stats["joins"] += 1
            self.add(join, loop)


def polls(*fns: Optional[Callable[["EventLoop"], None]]) -> Optional[Callable[["EventLoop"], None]]:
    """One EventLoop poll that runs each of `fns` (None ones skipped) in turn."""
    fns = tuple(f for f in fns if f is not None)
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def poll(loop):
        for f in fns:
            f(loop)

    return poll

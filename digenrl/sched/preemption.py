"""sched.preemption: when spot rollout workers are reclaimed, as data both clocks read.

A spot (preemptible) worker is reclaimed with a short notice. It gets a `Notice` at `at_s`
and must be gone by `at_s + notice_s`:

    at_s ------------- notice_s -------------> deadline_s
      drain: finish the running unit, or hand      past it: lost; its work is
      the trajectory over at the next step          regenerated (Scheduler.worker_lost)
      boundary (Scheduler.drain)

A replacement, when the provider brings one, arrives as a `Join` `replace_s` after the
notice and is itself a spot worker (it may be reclaimed in turn).

One seeded process (`draw`) and one trace format (`read_trace` / `write_trace`, JSON lines)
serve the simulator, which turns them into engine events on its virtual clock
(`engine_events`), and the emulated runtime, which sends the notices on the run's own
clock: the two run the same preemptions. No clock and no randomness outside `draw`'s seed.

Trace lines (seconds from the start of the run):

    {"event": "notice", "at_s": 812.4, "worker": "rollout-3", "notice_s": 30.0}
    {"event": "join", "at_s": 902.4, "worker": "rollout-3+1", "replaces": "rollout-3"}
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union


@dataclass(frozen=True)
class SpotSpec:
    """The price and the reclaim behaviour of one spot device type.

    price: USD per device-hour. interruptions_per_hour: each worker's reclaim rate (a Poisson
    process). notice_s: warning before the device is taken. replace_s: seconds from a notice
    to a replacement worker's arrival; None when nothing replaces it.
    """

    price: float
    interruptions_per_hour: float
    notice_s: float
    replace_s: Optional[float] = None

    def __post_init__(self):
        for name in ("price", "interruptions_per_hour", "notice_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"spot.{name} must be a finite number >= 0, got {value!r}")
        if self.replace_s is not None and not (math.isfinite(self.replace_s) and self.replace_s >= 0):
            raise ValueError(f"spot.replace_s must be a finite number >= 0 or null, got {self.replace_s!r}")


@dataclass(frozen=True, order=True)
class Notice:
    """`worker` is told at `at_s` that it will be taken `notice_s` later."""

    at_s: float
    worker: str
    notice_s: float

    @property
    def deadline_s(self) -> float:
        return self.at_s + self.notice_s


@dataclass(frozen=True, order=True)
class Join:
    """A replacement `worker` arrives at `at_s` in place of the reclaimed `replaces`."""

    at_s: float
    worker: str
    replaces: str


Event = Union[Notice, Join]


def replacement_id(worker: str, n: int) -> str:
    """The id of the n-th replacement (n >= 1) in the line of `worker`: "rollout-3+2"."""
    return f"{worker.split('+')[0]}+{n}"


def draw(spec: SpotSpec, workers: Sequence[str], horizon_s: float, seed: int) -> list[Event]:
    """Seeded reclaims of `workers` (and of their replacements) in [0, horizon_s), by time.

    Each worker's notices come as a Poisson process of rate spec.interruptions_per_hour; a
    replacement (when spec.replace_s is set) joins replace_s after its predecessor's notice
    and is reclaimed by the same process from its arrival on. Every worker line has its own
    random stream (seeded from `seed` and its position), so adding a worker to the pool
    leaves the other lines' draws as they were.
    """
    if horizon_s < 0:
        raise ValueError(f"horizon_s must be >= 0, got {horizon_s}")
    if len(set(workers)) != len(workers):
        raise ValueError(f"worker ids must be unique, got {list(workers)}")
    rate_per_s = spec.interruptions_per_hour / 3600.0
    events: list[Event] = []
    for position, first in enumerate(workers):
        rng = random.Random(f"{seed}/{position}")
        worker, since, n = first, 0.0, 0
        while rate_per_s > 0:
            at = since + rng.expovariate(rate_per_s)
            if at >= horizon_s:
                break
            events.append(Notice(at, worker, spec.notice_s))
            if spec.replace_s is None:
                break
            n += 1
            joined = at + spec.replace_s
            if joined >= horizon_s:
                break
            successor = replacement_id(first, n)
            events.append(Join(joined, successor, worker))
            worker, since = successor, joined
    return sorted(events, key=lambda e: (e.at_s, isinstance(e, Join), e.worker))


def engine_events(events: Iterable[Event]) -> tuple[list[tuple[float, str]], list[tuple[float, str]],
                                                    list[tuple[float, str]]]:
    """(drains, deadlines, joins) as (time, worker id) lists for a virtual-clock run.

    A drain asks the worker to leave at its notice; a deadline loses it then if it has not
    left (a worker that already left is skipped); a join adds the replacement.
    """
    drains, deadlines, joins = [], [], []
    for e in events:
        if isinstance(e, Notice):
            drains.append((e.at_s, e.worker))
            deadlines.append((e.deadline_s, e.worker))
        else:
            joins.append((e.at_s, e.worker))
    return drains, deadlines, joins


def write_trace(path: Union[str, Path], events: Iterable[Event]) -> None:
    """Write `events` as the JSON-lines trace the module docstring shows."""
    with open(path, "w") as f:
        for e in events:
            if isinstance(e, Notice):
                row = {"event": "notice", "at_s": e.at_s, "worker": e.worker, "notice_s": e.notice_s}
            else:
                row = {"event": "join", "at_s": e.at_s, "worker": e.worker, "replaces": e.replaces}
            f.write(json.dumps(row) + "\n")


def read_trace(path: Union[str, Path]) -> list[Event]:
    """The events of a JSON-lines trace, by time. ValueError names the line of a bad row."""
    events: list[Event] = []
    fields = {"notice": ("at_s", "worker", "notice_s"), "join": ("at_s", "worker", "replaces")}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not JSON ({err.msg})") from None
            kind = row.get("event") if isinstance(row, dict) else None
            if kind not in fields:
                raise ValueError(f"{where}: 'event' must be 'notice' or 'join', got {kind!r}")
            missing = [k for k in fields[kind] if k not in row]
            extra = sorted(set(row) - set(fields[kind]) - {"event"})
            if missing or extra:
                raise ValueError(f"{where}: a {kind} row has exactly {', '.join(fields[kind])}; "
                                 f"missing {missing}, unknown {extra}")
            at, notice = row["at_s"], row.get("notice_s", 0.0)
            if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in (at, notice)):
                raise ValueError(f"{where}: at_s and notice_s must be finite numbers >= 0")
            if kind == "notice":
                events.append(Notice(float(at), str(row["worker"]), float(notice)))
            else:
                events.append(Join(float(at), str(row["worker"]), str(row["replaces"])))
    return sorted(events, key=lambda e: (e.at_s, isinstance(e, Join), e.worker))

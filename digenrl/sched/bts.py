"""BTS, Recursive Bubble-Triggered TAG Search (the DigenRL RFC, verl-project/verl-omni issue 321):
at each trainer bubble, insert TAG (the idle trainer generates a micro-batch) only when that
shortens the predicted makespan of the rest of the RL step. "More TAG is not always better:
excess generation can make the Trainer the new bottleneck."

Pure: no clock, no Ray, no torch. Durations come from `Profile`, which learns the mean seconds
of each (unit kind, role, size) from completed units: the simulator feeds it the cost model's
durations, the runtime the measured ones, so both decide from the same kind of numbers.

The prediction (`predict_rest`) is a list schedule of the step's remaining work on counts:

    rollout workers   each takes the next unstarted micro-batch when free: ready (generated and
                      scored) g_r + w_r later
    trainers          each, when free, trains a ready Train unit (u units of t seconds per
                      micro-batch, any trainer); with none ready it is in a bubble, where the
                      search chooses
                        SkipBubble  wait for the next micro-batch to become ready
                        InsertTAG   generate one micro-batch itself: a switch into the helper
                                    (s_in), g_t + w_t, then a switch back (s_out) before it
                                    trains again
    makespan          when the last Train unit ends

`best(state, depth)` explores both choices at every bubble of the predicted schedule, depth
bounded (past the bound: SkipBubble), memoised on the rounded state; the scheduler asks it at
a real bubble and takes the choice with the smaller makespan (a tie: SkipBubble, no switch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

DEPTH = 4  # InsertTAG / SkipBubble choices explored per decision
ROUND = 1e-3  # memo key resolution, relative to a micro-batch's generation time


@dataclass
class Profile:
    """Seconds per unit of work of each (unit kind, role), learned from completed units:
    `observe(kind, role, work, seconds)`, `rate(kind, role)` = seconds / work over all of them."""

    sums: dict = field(default_factory=dict)

    def observe(self, kind: str, role: str, work: float, seconds: float) -> None:
        if work <= 0:
            return
        s = self.sums.setdefault((kind, role), [0.0, 0.0])
        s[0] += seconds
        s[1] += work

    def rate(self, kind: str, role: str) -> Optional[float]:
        s = self.sums.get((kind, role))
        return s[0] / s[1] if s else None


@dataclass(frozen=True)
class Rates:
    """What the prediction needs, in seconds: a whole micro-batch generated on a rollout worker
    (g_r) and on a trainer (g_t), scored there (w_r, w_t), one Train unit (t) and u of them per
    micro-batch, and a switch into (s_in) and out of (s_out) the helper."""

    g_r: float
    w_r: float
    g_t: float
    w_t: float
    t: float
    u: int
    s_in: float = 0.0
    s_out: float = 0.0


@dataclass(frozen=True)
class Decision:
    """One bubble's choice, for the trace: predicted makespans of the rest of the step."""

    step: int
    worker: str
    insert: bool
    skip_s: float
    insert_s: float

    @property
    def gain_s(self) -> float:
        """Predicted seconds saved by the choice taken (0 for a skip that won)."""
        return max(0.0, self.skip_s - self.insert_s) if self.insert else 0.0


class Search:
    """The recursive search over one prediction; memoised on the rounded state."""

    def __init__(self, r: Rates, depth: int = DEPTH):
        self.r, self.depth = r, depth
        self.scale = max(r.g_r, r.g_t, r.t, 1e-9) * ROUND
        self.memo: dict = {}

    def _key(self, *xs) -> tuple:
        q = self.scale
        return tuple(tuple(round(v / q) for v in x) if isinstance(x, tuple) else x for x in xs)

    def best(self, fresh: int, rollout: tuple, trainers: tuple, ready: tuple, units: int, out: tuple,
             depth: int) -> float:
        """Predicted makespan from the state: `fresh` unstarted micro-batches; each rollout
        worker's free time; each trainer's free time and whether it must switch back from the
        helper before it trains (`out`, same order); the times Train units become ready
        (sorted); `units` Train units still to run, the fresh micro-batches' included."""
        key = self._key(fresh, rollout, trainers, ready, units, out, depth)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        r, inf = self.r, float("inf")
        rollout, ready, trainers, out = list(rollout), list(ready), list(trainers), list(out)
        end = 0.0
        while units > 0:
            i = min(range(len(rollout)), key=rollout.__getitem__) if fresh and rollout else None
            j = min(range(len(trainers)), key=trainers.__getitem__)
            now = trainers[j]
            if i is not None and rollout[i] <= now:  # a rollout worker takes the next micro-batch
                rollout[i] += r.g_r + r.w_r
                insort_many(ready, rollout[i], r.u)
                fresh -= 1
                continue
            if ready and ready[0] <= now:  # training work is ready: train
                ready.pop(0)
                trainers[j] = now + r.t + (r.s_out if out[j] else 0.0)
                out[j] = False
                units -= 1
                end = max(end, trainers[j])
                continue
            # a bubble: SkipBubble waits for the next event that can bring training work
            wait = min(ready[0] if ready else inf, rollout[i] if i is not None else inf)
            if fresh and (depth > 0 or wait == inf):
                ins_t, ins_o = trainers[:], out[:]
                ins_t[j] = now + (0.0 if out[j] else r.s_in) + r.g_t + r.w_t
                ins_o[j] = True
                ins_ready = ready[:]
                insort_many(ins_ready, ins_t[j], r.u)
                b = self.best(fresh - 1, tuple(rollout), tuple(ins_t), tuple(ins_ready), units, tuple(ins_o),
                              depth - 1)
                if wait == inf:  # nothing else can generate it: the trainer must
                    end = max(end, b)
                    break
                skip_t = trainers[:]
                skip_t[j] = wait
                a = self.best(fresh, tuple(rollout), tuple(skip_t), tuple(ready), units, tuple(out), depth - 1)
                end = max(end, min(a, b))
                break
            if wait == inf:
                break  # no work can appear (units left unreachable: a malformed state)
            trainers[j] = wait
        self.memo[key] = end
        return end


def insort_many(xs: list, x: float, n: int) -> None:
    """Insert n copies of x into the sorted list xs."""
    import bisect

    k = bisect.bisect_right(xs, x)
    xs[k:k] = [x] * n


def decide(r: Rates, fresh: int, rollout: list[float], trainers: list[float], ready: list[float],
           units: int, depth: int = DEPTH) -> tuple[bool, float, float]:
    """At a bubble of one trainer (free now, at 0.0; `trainers` the other trainers' free times):
    (insert, predicted makespan if it skips, if it generates one micro-batch now). `units`:
    Train units of the step not yet run, the fresh micro-batches' included; `ready`: when the
    others (of micro-batches generating or done) become ready."""
    if not fresh:
        return False, 0.0, 0.0
    s = Search(r, depth)
    inf = float("inf")
    wait = min(min(ready, default=inf), min(rollout, default=inf))
    ins_t = [r.s_in + r.g_t + r.w_t] + list(trainers)
    ins_ready = sorted(ready)
    insort_many(ins_ready, ins_t[0], r.u)
    ins = s.best(fresh - 1, tuple(rollout), tuple(ins_t), tuple(ins_ready), units,
                 (True,) + (False,) * len(trainers), depth)
    if wait == inf:
        return True, inf, ins
    skip = s.best(fresh, tuple(rollout), (max(wait, 0.0),) + tuple(trainers), tuple(sorted(ready)), units,
                  (False,) * (1 + len(trainers)), depth)
    return ins < skip, skip, ins


__all__ = ["DEPTH", "Decision", "Profile", "Rates", "Search", "decide"]

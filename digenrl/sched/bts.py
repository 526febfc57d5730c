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

import bisect
import heapq
import math

from dataclasses import dataclass, field
from typing import Optional

DEPTH = 3  # InsertTAG / SkipBubble choices explored per decision
TIE = 1e-9  # InsertTAG must beat SkipBubble by more than this fraction (no switch for nothing)
ROUND = 1e-2  # memo key resolution, relative to a micro-batch's generation time
MEMO_LIMIT = 200_000  # states one run's memo holds before it starts over (bounded memory)


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

    def _key(self, xs: tuple) -> tuple:
        q = self.scale
        return tuple([int(v / q) for v in xs])

    def best(self, fresh: int, rollout: tuple, trainers: tuple, ready: tuple, units: int, depth: int) -> float:
        """Predicted makespan from the state: `fresh` unstarted micro-batches; each rollout
        worker's free time; each trainer as (free time, must switch back from the helper before
        it trains), a heap; the times Train units become ready (sorted); `units` Train units
        still to run, the fresh micro-batches' included."""
        key = (fresh, self._key(rollout), self._key(tuple(t for t, _ in trainers)),
               tuple(o for _, o in trainers), self._key(ready), units, depth)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        r, inf = self.r, float("inf")
        rollout, trainers = list(rollout), list(trainers)  # heaps
        ready, k = list(ready), 0  # ready[k:] not taken yet (sorted)
        end = 0.0
        while units > 0:
            now, out = trainers[0]
            if fresh and rollout and rollout[0] <= now:  # a rollout worker takes the next micro-batch
                t = heapq.heapreplace(rollout, rollout[0] + r.g_r + r.w_r) + r.g_r + r.w_r
                insort_many(ready, t, r.u, k)
                fresh -= 1
                continue
            if k < len(ready) and ready[k] <= now:  # training work is ready: train
                k += 1
                t = now + r.t + (r.s_out if out else 0.0)
                heapq.heapreplace(trainers, (t, False))
                units -= 1
                end = max(end, t)
                continue
            # a bubble: SkipBubble waits for training work: the next ready unit, or the next
            # micro-batch a rollout worker can start, generated and scored
            wait = min(ready[k] if k < len(ready) else inf,
                       max(rollout[0], now) + r.g_r + r.w_r if fresh and rollout else inf)
            if fresh and (depth > 0 or wait == inf):
                done = now + (0.0 if out else r.s_in) + r.g_t + r.w_t
                ins_t = trainers[:]
                heapq.heapreplace(ins_t, (done, True))
                ins_ready = ready[k:]
                insort_many(ins_ready, done, r.u)
                b = self.best(fresh - 1, tuple(rollout), tuple(ins_t), tuple(ins_ready), units, depth - 1)
                if wait == inf:  # nothing else can generate it: the trainer must
                    end = max(end, b)
                    break
                skip_t = trainers[:]
                heapq.heapreplace(skip_t, (wait, out))
                a = self.best(fresh, tuple(rollout), tuple(skip_t), tuple(ready[k:]), units, depth - 1)
                end = max(end, min(a, b))
                break
            if wait == inf:
                break  # no work can appear (units left unreachable: a malformed state)
            heapq.heapreplace(trainers, (wait, out))
        self.memo[key] = end
        return end


class Memo:
    """One run's searches, shared by all its bubbles: a `Search` (and its memo of explored
    states) per set of rates, each rate rounded to ROUND of itself. A run's steps repeat the
    same bubbles, so a bubble whose rounded state an earlier one explored is a lookup; the
    rates drift by float noise as the profile averages, which the rounding absorbs. A search
    keeps the rates it was made with (within ROUND of the ones asked)."""

    def __init__(self, limit: int = MEMO_LIMIT):
        self.limit = limit
        self._searches: dict = {}

    def search(self, r: Rates, depth: int = DEPTH) -> Search:
        key = (tuple(_bucket(x) for x in (r.g_r, r.w_r, r.g_t, r.w_t, r.t, r.s_in, r.s_out)), r.u, depth)
        s = self._searches.get(key)
        if s is None:
            s = self._searches[key] = Search(r, depth)
        if len(s.memo) > self.limit:
            s.memo.clear()
        return s


def _bucket(x: float) -> int:
    """x's rounding bucket for `Memo`: ROUND of itself wide; 0 is its own bucket."""
    return round(math.log(x) / math.log1p(ROUND)) if x > 0 else -(1 << 30)


def insort_many(xs: list, x: float, n: int, lo: int = 0) -> None:
    """Insert n copies of x into the sorted list xs (xs[lo:] sorted)."""
    k = bisect.bisect_right(xs, x, lo)
    xs[k:k] = [x] * n


def decide(r: Rates, fresh: int, rollout: list[float], trainers: list[float], ready: list[float],
           units: int, depth: int = DEPTH, memo: Optional[Memo] = None) -> tuple[bool, float, float]:
    """At a bubble of one trainer (free now, at 0.0; `trainers` the other trainers' free times):
    (insert, predicted makespan if it skips, if it generates one micro-batch now). `units`:
    Train units of the step not yet run, the fresh micro-batches' included; `ready`: when the
    others (of micro-batches generating or done) become ready. `memo`: the run's searches, shared
    across its bubbles (a fresh search without it)."""
    if not fresh:
        return False, 0.0, 0.0
    s = Search(r, depth) if memo is None else memo.search(r, depth)
    r = s.r
    inf = float("inf")
    # Only the `fresh` earliest-free rollout workers can take a micro-batch in the prediction:
    # each pick is the earliest free, and while j < fresh picks are made, one of those is still
    # unpicked and no later than any other worker. Exact, and the state stays small on a large pool.
    rollout = heapq.nsmallest(fresh, rollout)
    others = [(t, False) for t in trainers]
    wait = min(min(ready, default=inf), rollout[0] + r.g_r + r.w_r if rollout else inf)
    done = r.s_in + r.g_t + r.w_t
    ins_t = sorted(others + [(done, True)])
    ins_ready = sorted(ready)
    insort_many(ins_ready, done, r.u)
    ins = s.best(fresh - 1, tuple(rollout), tuple(ins_t), tuple(ins_ready), units, depth)
    if wait == inf:
        return True, inf, ins
    skip = s.best(fresh, tuple(rollout), tuple(sorted(others + [(max(wait, 0.0), False)])), tuple(sorted(ready)),
                  units, depth)
    # a tie (to float noise: a runtime measuring time_scale * d where the simulator has d) skips
    return ins < skip * (1 - TIE), skip, ins


__all__ = ["DEPTH", "Decision", "Memo", "Profile", "Rates", "Search", "decide"]

"""BTS, Recursive Bubble-Triggered TAG Search (the DigenRL RFC, verl-project/verl-omni issue 321):
at each trainer bubble, insert TAG (the idle trainer generates a micro-batch) only when that
shortens the predicted makespan of the rest of the RL step. "More TAG is not always better:
excess generation can make the Trainer the new bottleneck."

Pure: no clock, no Ray, no torch. Durations come from `Profile`, which learns the mean seconds
of each (unit kind, role, size) from completed units: the simulator feeds it the cost model's
durations, the runtime the measured ones, so both decide from the same kind of numbers.

The prediction (`Search.best`) is a list schedule of the step's remaining work on counts. A
micro-batch is generated in s pieces (its Generate shards, 1/s of it each); a piece takes 1/s
of g_r on a rollout worker, of g_t on a trainer, and is scored 1/s of w_r (w_t) later: by the
worker that made it before its next unit, or by a reward pool while it goes on. Pieces of
started micro-batches wait in a queue, first in first out; a micro-batch is ready (its u Train
units can start) when its last piece is scored.

    rollout workers   each, when free, takes the next queued piece, else starts the next
                      unstarted micro-batch: it makes the first piece, the rest are queued
    trainers          each, when free, trains a ready Train unit (u units of t seconds per
                      micro-batch, any trainer); with none ready it is in a bubble, where the
                      search chooses
                        SkipBubble  wait until the next micro-batch could be ready: the next
                                    ready time, or the queued micro-batch (else the next
                                    unstarted one) made by the rollout workers alone
                        InsertTAG   generate: the next queued piece, else the first piece of
                                    the next unstarted micro-batch, whose other pieces the
                                    trainers idle beside it take at once (as the scheduler
                                    hands out a micro-batch's shards), the rest queued. A
                                    switch into the helper (s_in) before, a switch back
                                    (s_out) before it trains again
    makespan          when the last Train unit ends, or a trainer still in the helper (or
                      generating) is back: the step's optimizer step waits for every trainer

`best(state, depth)` explores both choices at every bubble of the predicted schedule, depth
bounded (past the bound: the better of one rule for every later bubble, InsertTAG always or
SkipBubble always), memoised on the rounded state; the scheduler asks it at a real bubble
(`decide`) and takes the choice with the smaller makespan. Of two choices that end the step
together, the one whose Train units end sooner on the whole (more slack against a wrong
prediction); a full tie: SkipBubble, no switch. A SkipBubble holds for every trainer idle at the
bubble (as in the scheduler).
"""

from __future__ import annotations

import bisect
import heapq
import math

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Optional

DEPTH = 3  # later bubbles of the prediction searched both ways (0: only the one asked about)
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
    micro-batch, and a switch into (s_in) and out of (s_out) the helper; a micro-batch is
    generated in s pieces (shards) of 1/s of g_r + w_r (g_t + w_t) each."""

    g_r: float
    w_r: float
    g_t: float
    w_t: float
    t: float
    u: int
    s_in: float = 0.0
    s_out: float = 0.0
    s: int = 1  # Generate shards (pieces) per micro-batch
    reward_pool: bool = False  # a reward pool scores (else the worker that generated, before its next unit)


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
        # a whole micro-batch on a rollout worker: its seconds busy, and until scored after that
        # (the worker scores what it made, or a reward pool does while it goes on)
        self.gen_r, self.after_r = (r.g_r, r.w_r) if r.reward_pool else (r.g_r + r.w_r, 0.0)
        self.gen_t, self.after_t = (r.g_t, r.w_t) if r.reward_pool else (r.g_t + r.w_t, 0.0)  # (switches apart)
        self.shares = (1.0 / r.s,) * r.s  # an unstarted micro-batch's pieces

    def best(self, fresh: int, rollout: tuple, trainers: tuple, ready: tuple, units: int, depth: int,
             queue: tuple = (), policy: Optional[bool] = None, hold: float = 0.0) -> tuple:
        """Predicted makespan from the state: `fresh` unstarted micro-batches; each rollout
        worker's free time; the trainers as (free time, must switch back from the helper before
        it trains, how many trainers), a heap (trainers alike to the prediction are one entry, so
        a large pool costs its distinct states, not its size); the times Train
        units become ready (sorted); `units` Train units
        still to run, the fresh micro-batches' included; `queue`: the started micro-batches with
        queued pieces, each (when its pieces made so far are scored, its queued pieces' shares).
        Past the depth bound the rest of the step follows one rule at every bubble, the better
        of InsertTAG always and SkipBubble always (`policy`: that rule, None while searching).
        `hold`: a SkipBubble taken at the question holds every bubble until then (as the
        scheduler holds it for every trainer of the step until training work appears): no
        trainer generates before it.
        Returns (makespan, the sum of the Train units' end times): of two choices the one that
        ends sooner, and of two that end together, the one whose training ends sooner on the
        whole (so a tie in makespan goes to the choice with more slack)."""
        q = self.scale
        key = (fresh, _rounded(rollout, q), tuple([(int(t / q), o, c) for t, o, c in trainers]),
               _rounded(ready, q), units, depth,
               tuple([(int(t / q), tuple([int(x * 1000) for x in sh])) for t, sh in queue]), policy,
               int(hold / q))
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if policy is None and depth <= 0:
            got = sooner(self.best(fresh, rollout, trainers, ready, units, depth, queue, True, hold),
                         self.best(fresh, rollout, trainers, ready, units, depth, queue, False, hold))
            self.memo[key] = got
            return got
        r, inf = self.r, float("inf")
        rollout, trainers, queue = list(rollout), list(trainers), list(queue)  # heaps; queue in order
        ready, k = list(ready), 0  # ready[k:] not taken yet (sorted)
        end = total = 0.0
        # the bubble's wait, kept while nothing it reads changed (trainers idle at one time in a
        # row ask the same question: on a large trainer pool most iterations are such waits)
        seen, wait = None, inf
        heapreplace, heappush, t_train, s_out = heapq.heapreplace, heapq.heappush, r.t, r.s_out
        gen_r, after_r, shares, u = self.gen_r, self.after_r, self.shares, r.u
        while units > 0:
            now, out, c = trainers[0]
            if rollout and rollout[0] <= now and (queue or fresh):
                # the rollout workers free by `now` take the next pieces, each the earliest free
                # worker: it makes 1/s of g_r, the piece is scored 1/s of w_r after (with no
                # reward pool, by the worker itself: after_r 0, gen_r g_r + w_r); the micro-batch
                # whose last piece this is becomes ready (its u Train units). Inline: most of a
                # prediction's steps are these
                r0 = rollout[0]
                while True:
                    if not queue:
                        queue.append((0.0, shares))
                        fresh -= 1
                    known, sh = queue[0]
                    n, i = len(sh), 0
                    while True:  # the head micro-batch's pieces, one a worker, while one is free
                        x = sh[i]
                        t = r0 + x * gen_r
                        heapreplace(rollout, t)
                        t = t + x * after_r
                        if t > known:
                            known = t
                        i += 1
                        r0 = rollout[0]
                        if i == n or r0 > now:
                            break
                    if i < n:
                        queue[0] = (known, sh[i:])
                        break
                    del queue[0]
                    insort_many(ready, known, u, k)
                    if r0 > now or not (queue or fresh):
                        break
                seen = None
                continue
            if k < len(ready) and ready[k] <= now:  # training work is ready: the trainers free at
                # `now` alike (one entry) train the ready units, one each, as many as both allow
                m = min(c, bisect.bisect_right(ready, now, k) - k, units)
                k += m
                t = now + t_train + (s_out if out else 0.0)
                if m < c:
                    heapreplace(trainers, (now, out, c - m))
                    heappush(trainers, (t, False, m))
                else:
                    heapreplace(trainers, (t, False, m))
                units -= m
                if t > end:
                    end = t
                for _ in range(m):  # (one addition per unit: the float sum a unit at a time gives)
                    total += t
                seen = None
                continue
            # a bubble
            if seen != now:
                wait = min(ready[k] if k < len(ready) else inf, self.next_ready(rollout, queue, fresh, now))
                seen = now
            if now < hold:  # held: it waits
                self.wait(trainers, now, min(wait, hold))
                continue
            can = queue or fresh
            if can and policy is not None and (policy or wait == inf):  # past the bound: the rule's choice
                fresh -= self.insert(trainers, queue, ready, now, fresh_first=False)
                seen = None
                continue
            if can and policy is None:
                ins_t, ins_q, ins_ready = trainers[:], queue[:], ready[k:]
                used = self.insert(ins_t, ins_q, ins_ready, now, fresh_first=False)
                b = self.best(fresh - used, tuple(rollout), tuple(ins_t), tuple(ins_ready), units, depth - 1,
                              tuple(ins_q), None, hold)
                if wait == inf:  # nothing else can generate it: the trainer must
                    end, total = max(end, b[0]), total + b[1]
                    break
                a = self.best(fresh, tuple(rollout), tuple(self.hold(trainers, now, wait)), tuple(ready[k:]), units,
                              depth - 1, tuple(queue), None, wait)
                a = sooner(b, a)
                end, total = max(end, a[0]), total + a[1]
                break
            if wait == inf:
                break  # no work can appear (units left unreachable: a malformed state)
            self.wait(trainers, now, wait)
        else:  # all trained: the optimizer step waits for every trainer, one still in the helper switched back
            for t, o, _ in trainers:
                if o:
                    end = max(end, t + r.s_out)
        self.memo[key] = got = (end, total)
        return got

    @staticmethod
    def wait(trainers: list, now: float, until: float) -> None:
        """Every trainer free by `now` (the heap's earliest) waits until `until`, in place. They
        are alike to the prediction: each would meet the same state and wait the same, one at a
        time. They leave as at most two entries: those in the helper and those not."""
        n = [0, 0]  # not in the helper, in it
        while trainers and trainers[0][0] <= now:
            _, o, c = heapq.heappop(trainers)
            n[o] += c
        for o in (False, True):
            if n[o]:
                heapq.heappush(trainers, (until, o, n[o]))

    def insert(self, trainers: list, queue: list, ready: list, now: float, fresh_first: bool) -> int:
        """InsertTAG by trainers[0] (free at `now`), on the state, in place: it makes the next
        queued piece, or (`fresh_first`, or nothing queued) the first piece of an unstarted
        micro-batch, whose next pieces the trainers free by `now` make at once (the scheduler
        hands a started micro-batch's shards to the idle workers of its pool), the rest queued.
        Each piece: one trainer out of the heap's earliest entry (its count one lower), free again
        after s_in (unless already in the helper) and its share of g_t, as an entry of one (free
        time, in the helper, 1); the piece scored its share of w_t later, and a micro-batch with no
        piece left ready (its u Train units into `ready`, sorted). Returns the unstarted
        micro-batches it started (0 or 1)."""
        heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace
        s_in, gen_t, after_t = self.r.s_in, self.gen_t, self.after_t
        fresh = fresh_first or not queue
        if fresh:
            queue.append((0.0, self.shares))
        i = len(queue) - 1 if fresh else 0
        known, shares = queue[i]
        n, j = len(shares), 0
        held = None
        while True:  # the first piece, then (a fresh micro-batch in pieces) one per trainer free by `now`
            t, out, c = trainers[0]
            if c > 1:
                heapreplace(trainers, (t, out, c - 1))
            else:
                heappop(trainers)
            sh = shares[j]
            t = now + (0.0 if out else s_in) + sh * gen_t
            done = t + sh * after_t
            if done > known:
                known = done
            j += 1
            if held is None:
                heappush(trainers, (t, True, 1))
                if not (fresh and self.r.s > 1):
                    break
                held = []
            else:
                held.append((t, True, 1))
            if j == n or trainers[0][0] > now:
                break
        if j < n:
            queue[i] = (known, shares[j:])
        else:
            del queue[i]
            insort_many(ready, known, self.r.u, 0)
        for x in held or ():
            heappush(trainers, x)
        return int(fresh)

    def next_ready(self, rollout: list, queue: list, fresh: int, now: float) -> float:
        """When the next micro-batch could be ready by the rollout workers alone, none starting
        before `now`: the head of the queue, else the next unstarted one."""
        if queue:
            known, shares = queue[0]
        elif fresh:
            known, shares = 0.0, self.shares
        else:
            return float("inf")
        if not rollout:
            return float("inf")
        heap = rollout[:]  # (a heap already: a copy, not nsmallest's Python loop; each piece takes the least)
        gen_r, after_r, heapreplace = self.gen_r, self.after_r, heapq.heapreplace
        for sh in shares:  # the earliest free worker makes each piece, not before `now`
            t = heap[0]
            if now > t:
                t = now
            t = t + sh * gen_r
            heapreplace(heap, t)
            t = t + sh * after_r
            if t > known:
                known = t
        return known

    @staticmethod
    def hold(trainers: list, now: float, wait: float) -> list:
        """SkipBubble at `now` (the earliest free time of `trainers`, a heap): a copy in which
        every trainer idle by then waits until `wait` (`Search.wait`)."""
        out = trainers[:]
        Search.wait(out, now, wait)
        return out


def _rounded(xs, q: float) -> tuple:
    """The memo key of a list of times: int(x / q) of each x, as runs (value, count) of that
    sequence (the same key, one to one, and short: a large pool's free times and a micro-batch's
    ready Train units come as runs of equal times), each run of equal times rounded once."""
    if xs and xs.count(xs[0]) == len(xs):  # one run (a pool's free times often are)
        return ((int(xs[0] / q), len(xs)),)
    out = []
    for x, run in groupby(xs):
        b, n = int(x / q), len(list(run))
        if out and out[-1][0] == b:
            out[-1] = (b, out[-1][1] + n)
        else:
            out.append((b, n))
    return tuple(out)


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
        key = (tuple(_bucket(x) for x in (r.g_r, r.w_r, r.g_t, r.w_t, r.t, r.s_in, r.s_out)), r.u, r.s,
               r.reward_pool, depth)
        s = self._searches.get(key)
        if s is None:
            s = self._searches[key] = Search(r, depth)
        if len(s.memo) > self.limit:
            s.memo.clear()
        return s


def _bucket(x: float) -> int:
    """x's rounding bucket for `Memo`: ROUND of itself wide; 0 is its own bucket."""
    return round(math.log(x) / math.log1p(ROUND)) if x > 0 else -(1 << 30)


def sooner(a: tuple, b: tuple) -> tuple:
    """Of two predictions (makespan, sum of Train end times), `a` where it ends sooner, or at the
    same time (within TIE: float noise, a runtime measuring time_scale * d where the simulator
    has d) with its training sooner on the whole by more than TIE; else `b` (a full tie: b)."""
    if a[0] < b[0] * (1 - TIE) or (a[0] <= b[0] * (1 + TIE) and a[1] < b[1] * (1 - TIE)):
        return a
    return b


def insort_many(xs: list, x: float, n: int, lo: int = 0) -> None:
    """Insert n copies of x into the sorted list xs (xs[lo:] sorted)."""
    k = bisect.bisect_right(xs, x, lo)
    xs[k:k] = [x] * n


def decide(r: Rates, fresh: int, rollout: list[float], trainers: list[float] | Mapping[float, int], ready: list[float],
           units: int, depth: int = DEPTH, memo: Optional[Memo] = None, pending: tuple = (),
           fragment: bool = False) -> tuple[bool, float, float]:
    """At a bubble of one trainer (free now, at 0.0; `trainers` the other trainers' free times,
    one each or as {free time: trainers}):
    (insert, predicted makespan if it skips, if it generates now). `units`: Train units of the
    step not yet run, the fresh micro-batches' included; `ready`: when the others (of micro-batches
    generating or done) become ready. `pending`: the started micro-batches with pieces queued for
    any worker (unstarted shards, trajectories handed back), in queue order, each as (when its
    other pieces are ready, the queued pieces' sizes as fractions of a micro-batch). The question
    is about the first queued piece with `fragment`, else about starting an unstarted
    micro-batch. `memo`: the run's searches, shared across its bubbles (a fresh search without it)."""
    fragment = fragment and bool(pending)  # (a fragment's question names its queued piece)
    if not fresh and not fragment:
        return False, 0.0, 0.0
    s = Search(r, depth) if memo is None else memo.search(r, depth)
    r = s.r
    inf = float("inf")
    # Only the earliest-free rollout workers can take a piece in the prediction: each pick is the
    # earliest free, and while j < n picks are made, one of the n earliest is still unpicked and
    # no later than any other worker. Exact, and the state stays small on a large pool.
    rollout = heapq.nsmallest(fresh * r.s + sum(len(sh) for _, sh in pending), rollout)
    queue = [(t, tuple(sh)) for t, sh in pending]
    free = Counter({t: c for t, c in trainers.items() if c > 0}) if isinstance(trainers, Mapping) else Counter(trainers)
    free[0.0] += 1  # the deciding trainer
    here = sorted([(t, False, c) for t, c in free.items()])  # (sorted: a heap, one form per state)
    ready = sorted(ready)
    ins_t, ins_q, ins_ready = here[:], queue[:], ready[:]
    used = s.insert(ins_t, ins_q, ins_ready, 0.0, fresh_first=not fragment)
    ins = s.best(fresh - used, tuple(rollout), tuple(ins_t), tuple(ins_ready), units, depth, tuple(ins_q))
    wait = min(ready[0] if ready else inf, s.next_ready(rollout, queue, fresh, 0.0))
    if wait == inf:
        return True, inf, ins[0]
    skip = s.best(fresh, tuple(rollout), tuple(s.hold(here, 0.0, wait)), tuple(ready), units, depth, tuple(queue),
                  None, wait)
    return sooner(ins, skip) is ins, skip[0], ins[0]


__all__ = ["DEPTH", "Decision", "Memo", "Profile", "Rates", "Search", "decide", "sooner"]

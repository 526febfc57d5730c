"""The scheduler: an event-driven state machine from (pools, events) to assignments.

See `digenrl.sched` for the dataflow diagram and the rules of each mode. Reading order:
`assign` (who gets what, in priority order), `complete` (what a finished unit makes
ready), `worker_lost` / `add_worker` (membership), then the small helpers.

Cost: every event and every assignment is O(1) amortized (O(#trainers) once per RL step
for the optimizer barrier). Idle workers are parked in ordered sets keyed by
(role, version), so `assign` only touches workers it actually assigns.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Optional

from .config import SchedConfig
from .units import (ROLES, Assignment, Generate, OptimizerStep, Reward, Train, Unit,
                    WeightSync, Worker)


class SchedulerError(RuntimeError):
    """An event the scheduler cannot handle (unknown worker, lost trainer, bad completion)."""


@dataclass(slots=True)
class _MB:
    """One micro-batch: whole prompt groups generated together by one policy version."""

    groups: tuple[int, ...]
    version: Optional[int] = None  # set when its first Generate starts; None = not started
    t_done: int = 0  # last completed denoising-step boundary (latent known there)


@dataclass(slots=True)
class _Step:
    mbs: list[_MB]
    fresh: deque  # mb indices not yet started, in order
    trained: tuple[int, ...]  # trained denoising-step indices of this RL step
    trains_left: int  # Train units not yet completed
    n_rewarded: int = 0
    held: list = None  # batch-level modes: Train units held until the whole step is rewarded


@dataclass(slots=True)
class _W:
    worker: Worker
    version: int  # rollout: weights it holds (-1 = none yet); trainer pools use Scheduler.version
    unit: Optional[Unit] = None  # in flight
    id: str = ""
    role: str = ""

    def __post_init__(self):
        self.id, self.role = self.worker.id, self.worker.role


class Scheduler:
    """Decides which unit runs on which worker next. Never reads a clock.

    Call `assign()` after every batch of events; it returns units for idle workers.
    Events: `complete(worker_id, unit)`, `worker_lost(worker_id)`, `add_worker(worker)`.
    """

    def __init__(self, cfg: SchedConfig, workers: Iterable[Worker]):
        self.cfg = cfg
        self.version = 0  # trainer policy version = optimizer steps done
        self.traj_version: dict[tuple[int, int], int] = {}  # (step, mb) -> behaviour version
        self.stats = {"handovers": 0, "restarts": 0, "requeued": 0}
        self._w: dict[str, _W] = {}
        # role -> version key -> ordered set of parked worker ids (dict for determinism;
        # popitem() is O(1) LIFO, unlike popping the front of a dict).
        self._idle: dict[str, dict[int, dict[str, None]]] = {r: {} for r in ROLES}
        self._pinned: dict[str, Unit] = {}  # work that must run on that worker next
        self._n_at: dict[int, int] = {}  # rollout workers holding each version
        self._train_role = "colocated" if cfg.colocated else "trainer"
        self._trainers: dict[str, None] = {}
        self._steps: dict[int, _Step] = {}
        self._open: list[int] = []  # steps with unstarted micro-batches, ascending
        self._next_step = 0
        self._train_q: dict[int, deque] = {}  # step -> ready Train units
        self._reward_q: deque = deque()
        self._cont_q: dict[int, deque] = {}  # version -> (step, mb, t_start) partial trajectories
        self._opt_step: Optional[int] = None  # RL step whose optimizer barrier is running
        self._opt_given: set = set()
        self._opt_reported = 0
        self._opt_new = False  # barrier just began: hand OptimizerStep to parked trainers
        self._handover_pending = 0
        self._started = False
        self._n_reward = 0
        self._n_syncing = 0  # WeightSync units in flight
        for w in workers:
            self._add(w, version=0)
        self._check_pools()
        self._open_steps()

    # ------------------------------------------------------------------ public state
    @property
    def done(self) -> bool:
        return self.version >= self.cfg.rl_steps

    @property
    def workers(self) -> list[Worker]:
        """Live workers, in the order they joined."""
        return [w.worker for w in self._w.values()]

    @property
    def in_flight(self) -> dict[str, Unit]:
        return {wid: w.unit for wid, w in self._w.items() if w.unit is not None}

    def worker_version(self, worker_id: str) -> int:
        w = self._w[worker_id]
        return self.version if w.worker.role in ("trainer", "colocated") else w.version

    # ------------------------------------------------------------------ assign
    def assign(self) -> list[Assignment]:
        """New units for idle workers, highest priority first (see package doc)."""
        self._started = True
        self._handover_pending = 0
        out: list[Assignment] = []
        if self._pinned:  # the next segment / the reward lives on that worker
            pinned, self._pinned = self._pinned, {}
            for wid, unit in pinned.items():
                self._start(self._w[wid], unit, out)
        if self._opt_new:  # collective: every parked trainer joins now, busy ones on completion
            self._opt_new = False
            for wid in self._idle[self._train_role].pop(0, {}):
                self._start_opt(self._w[wid], out)
        # The checks below are cheap guards: assign runs after every event.
        barrier = self._opt_step is not None
        idle_t = self._idle[self._train_role]
        if not barrier and idle_t:
            tq = self._train_q.get(self.version)
            while tq and (ws := self._pop_idle(self._train_role, 0)) is not None:
                self._start(ws, tq.popleft(), out)
        if self._reward_q:
            self._match_rewards(out)
        if self._cont_q:
            self._match_continuations(out, barrier)
        idle_r = self._idle["rollout"]
        eager = self.cfg.tcss  # adopt the newest weights at the first trajectory boundary
        if eager and idle_r:
            self._match_syncs(out)
        if self._open and (idle_r or (idle_t and not barrier)):
            self._match_fresh(out, barrier)
        if not eager and idle_r:  # lazy: sync once nothing is left for the old weights
            self._match_syncs(out)
        return out

    def _match_rewards(self, out):
        if not self._reward_q:
            return
        # Without a reward pool a re-queued Reward (its worker was lost) runs on any
        # generating worker; normally Rewards are pinned to the worker that generated.
        roles = ("reward",) if self._n_reward else ("rollout", "colocated", "trainer")
        for role in roles:
            for v in list(self._idle[role]):
                while self._reward_q:
                    ws = self._pop_idle(role, v)
                    if ws is None:
                        break
                    self._start(ws, self._reward_q.popleft(), out)

    def _match_continuations(self, out, barrier):
        P = self.version
        for v in list(self._cont_q):
            q = self._cont_q[v]
            while q:
                ws = self._pop_idle("rollout", v)
                if ws is None and self.cfg.tag and not barrier and v == P and q[0][0] == P:
                    ws = self._pop_idle("trainer", 0)  # nothing to train: finish it itself
                if ws is None:
                    break
                step, mb, t = q.popleft()
                self._start(ws, self._gen(ws, step, mb, v, t), out)
            if not q:
                del self._cont_q[v]

    def _match_syncs(self, out):
        P = self.version
        idle_r = self._idle["rollout"]
        for v in [v for v in idle_r if v < P]:
            for wid in idle_r.pop(v):
                self._start(self._w[wid], WeightSync(P), out)

    def _match_fresh(self, out, barrier):
        cfg, P = self.cfg, self.version
        for s in list(self._open):
            st = self._steps[s]
            # Fresher weights first; the window is [s - lag, s] (on-policy: exactly s).
            for v in range(min(s, P), max(0, s - cfg.lag) - 1, -1):
                while st.fresh and (ws := self._pop_idle("rollout", v)) is not None:
                    self._start_fresh(ws, s, v, out)
            if s == P and not barrier and (cfg.colocated or cfg.tag):
                # Colocated workers generate their step; under TAG idle trainers do too,
                # with their own (current) weights: on-policy, no sync needed. TAG leaves
                # one micro-batch for each rollout worker that is idle or syncing (free
                # within a sync), else trainers would starve the rollout pool.
                reserve = 0 if cfg.colocated else (
                    self._n_syncing + sum(len(p) for p in self._idle["rollout"].values()))
                while len(st.fresh) > reserve and (ws := self._pop_idle(self._train_role, 0)):
                    self._start_fresh(ws, s, P, out)
            if not st.fresh:
                self._open.remove(s)

    # ------------------------------------------------------------------ events
    def complete(self, worker_id: str, unit: Unit) -> None:
        """Event: `unit` finished on `worker_id` (its outputs are in the object store)."""
        ws = self._w.get(worker_id)
        if ws is None:
            raise SchedulerError(f"complete(): unknown or removed worker {worker_id!r}")
        if ws.unit != unit:
            raise SchedulerError(f"complete(): worker {worker_id!r} is running {ws.unit}, "
                                 f"not {unit}")
        ws.unit = None
        kind = type(unit)
        if kind is Generate:
            self._on_generated(ws, unit)
        elif kind is Reward:
            self._on_rewarded(unit)
        elif kind is Train:
            self._on_trained(unit)
        elif kind is OptimizerStep:
            self._on_optimizer_step(unit)
        else:  # WeightSync: the version was taken at assignment (busy until now)
            self._n_syncing -= 1
        if worker_id in self._pinned:
            return
        if (self._opt_step is not None and ws.worker.role == self._train_role
                and worker_id not in self._opt_given):
            self._pinned[worker_id] = OptimizerStep(self._opt_step, self._opt_step + 1)
            self._opt_given.add(worker_id)
            return
        self._park(ws)

    def _on_generated(self, ws: _W, g: Generate) -> None:
        cfg = self.cfg
        self._steps[g.step].mbs[g.mb].t_done = g.t_end
        if g.t_end < cfg.num_steps:
            ready = len(self._train_q.get(self.version, ()))
            if ws.worker.role == "trainer" and ready > self._handover_pending:
                # TAG: training work is ready; give generation back at this boundary.
                self._handover_pending += 1
                self.stats["handovers"] += 1
                self._push_cont(g.version, g.step, g.mb, g.t_end)
            else:  # the latent lives here: keep going on the same worker
                self._pinned[ws.worker.id] = self._gen(ws, g.step, g.mb, g.version, g.t_end)
        elif self._n_reward:
            self._reward_q.append(Reward(g.step, g.mb, g.groups))
        else:  # no reward pool: score on the worker holding the images, right away
            self._pinned[ws.worker.id] = Reward(g.step, g.mb, g.groups)

    def _on_rewarded(self, r: Reward) -> None:
        st = self._steps[r.step]
        st.n_rewarded += 1
        version = st.mbs[r.mb].version
        if self.cfg.tsp:
            c = self.cfg.tsp_chunk
            chunks = [st.trained[i:i + c] for i in range(0, len(st.trained), c)]
        else:
            chunks = [st.trained]
        units = [Train(r.step, r.mb, r.groups, ts, version) for ts in chunks]
        q = self._train_q.setdefault(r.step, deque())
        if self.cfg.gap:  # stream: train as soon as a micro-batch is rewarded
            q.extend(units)
        else:  # batch-level: nothing trains before the whole step is rewarded
            st.held.extend(units)
            if st.n_rewarded == len(st.mbs):
                q.extend(st.held)
                st.held = []

    def _on_trained(self, t: Train) -> None:
        st = self._steps[t.step]
        st.trains_left -= 1
        if st.trains_left == 0:
            self._opt_step, self._opt_given, self._opt_reported = t.step, set(), 0
            self._opt_new = True

    def _on_optimizer_step(self, o: OptimizerStep) -> None:
        self._opt_reported += 1
        if self._opt_reported < len(self._trainers):
            return
        old = self.version
        self.version = o.version
        self._opt_step = None
        del self._steps[o.step]
        self._train_q.pop(o.step, None)
        self._open_steps()
        self._rescue(old)  # trainers no longer hold `old`

    def worker_lost(self, worker_id: str) -> None:
        """Event: a worker died. Its in-flight and pinned units are re-queued.

        Generate restarts from its t_start (the last completed boundary, whose latent was
        returned with that segment) on a worker holding the same version, or from t=0 if
        t_start == 0 or no live worker holds that version any more. A trainer loss is
        not handled here: the runtime resumes from a checkpoint.
        """
        ws = self._w.get(worker_id)
        if ws is None:
            raise SchedulerError(f"worker_lost(): unknown or removed worker {worker_id!r}")
        if ws.worker.role in ("trainer", "colocated"):
            raise SchedulerError(
                f"worker_lost({worker_id!r}): a {ws.worker.role} worker holds gradient and "
                "optimizer state; the scheduler cannot recover it. Resume the run from the "
                "last checkpoint (runtime).")
        self._unpark(ws)
        del self._w[worker_id]
        if ws.worker.role == "rollout":
            self._n_at[ws.version] -= 1
        else:
            self._n_reward -= 1
        if type(ws.unit) is WeightSync:
            self._n_syncing -= 1
        lost = [u for u in (ws.unit, self._pinned.pop(worker_id, None)) if u is not None]
        for u in lost:
            self.stats["requeued"] += 1
            if type(u) is Generate:
                if u.t_start > 0:
                    self._push_cont(u.version, u.step, u.mb, u.t_start)
                else:
                    self._restart(u.step, u.mb)
            elif type(u) is Reward:
                self._reward_q.appendleft(u)
        self._rescue(ws.version)

    def add_worker(self, worker: Worker) -> None:
        """Event: a (replacement) rollout or reward worker joined; it syncs weights first."""
        if worker.role in ("trainer", "colocated") and self._started:
            raise SchedulerError(f"add_worker({worker.id!r}): trainers cannot join a running "
                                 "step (optimizer state); restart from a checkpoint instead")
        self._add(worker, version=-1 if worker.role == "rollout" else 0)

    # ------------------------------------------------------------------ helpers
    def _add(self, w: Worker, version: int) -> None:
        if w.id in self._w:
            raise SchedulerError(f"duplicate worker id {w.id!r}")
        ws = _W(w, version)
        self._w[w.id] = ws
        if w.role == "rollout":
            self._n_at[version] = self._n_at.get(version, 0) + 1
        elif w.role == "reward":
            self._n_reward += 1
        else:
            self._trainers[w.id] = None
        self._park(ws)

    def _check_pools(self) -> None:
        roles = {w.worker.role for w in self._w.values()}
        if self.cfg.colocated:
            if "colocated" not in roles or roles & {"rollout", "trainer"}:
                raise SchedulerError("mode='colocated' needs workers with role 'colocated' "
                                     "(and optionally 'reward'), got roles " + str(sorted(roles)))
        else:
            if "colocated" in roles or "trainer" not in roles:
                raise SchedulerError(f"mode={self.cfg.mode!r} needs a 'trainer' pool and no "
                                     "'colocated' workers, got roles " + str(sorted(roles)))
            if "rollout" not in roles and not self.cfg.tag:
                raise SchedulerError(f"mode={self.cfg.mode!r} without tag needs a 'rollout' pool")

    def _open_steps(self) -> None:
        """Create every step some worker may now generate: s <= version + lag."""
        cfg = self.cfg
        while self._next_step < cfg.rl_steps and self._next_step <= self.version + cfg.lag:
            s, m = self._next_step, cfg.micro_batch_groups
            mbs = [_MB(tuple(range(i, min(i + m, cfg.groups_per_step))))
                   for i in range(0, cfg.groups_per_step, m)]
            trained = cfg.trained(s)
            per_mb = -(-len(trained) // cfg.tsp_chunk) if cfg.tsp else 1
            self._steps[s] = _Step(mbs, deque(range(len(mbs))), trained, per_mb * len(mbs), held=[])
            self._open.append(s)
            self._next_step += 1

    def _gen(self, ws: _W, step: int, mb: int, version: int, t: int) -> Generate:
        role, n = ws.worker.role, self.cfg.num_steps
        seg = {"trainer": self.cfg.tag_segment, "rollout": self.cfg.rollout_segment}.get(role)
        t_end = n if seg is None else min(t + seg, n)
        return Generate(step, mb, self._steps[step].mbs[mb].groups, version, t, t_end)

    def _start_fresh(self, ws: _W, step: int, version: int, out) -> None:
        st = self._steps[step]
        mb = st.fresh.popleft()
        st.mbs[mb].version = version
        self.traj_version[(step, mb)] = version
        self._start(ws, self._gen(ws, step, mb, version, 0), out)

    def _start_opt(self, ws: _W, out) -> None:
        self._opt_given.add(ws.worker.id)
        self._start(ws, OptimizerStep(self._opt_step, self._opt_step + 1), out)

    def _start(self, ws: _W, unit: Unit, out) -> None:
        ws.unit = unit
        if type(unit) is WeightSync:
            # The worker holds the new weights from now on for matching purposes: it is
            # busy until the sync completes, and its old version must not attract work.
            old = ws.version
            self._n_syncing += 1
            self._n_at[old] -= 1
            self._n_at[unit.version] = self._n_at.get(unit.version, 0) + 1
            ws.version = unit.version
            self._rescue(old)
        out.append(Assignment(ws.id, unit))

    def _push_cont(self, version: int, step: int, mb: int, t: int) -> None:
        self._cont_q.setdefault(version, deque()).append((step, mb, t))
        self._rescue(version)

    def _rescue(self, version: int) -> None:
        """Partial trajectories of an old `version` that nobody holds restart from t=0.

        The current version is always obtainable (any rollout worker syncs to it), so only
        versions < self.version can strand a continuation.
        """
        q = self._cont_q.get(version)
        if not q or version >= self.version or self._n_at.get(version, 0) > 0:
            return
        del self._cont_q[version]
        for step, mb, _ in q:
            self._restart(step, mb)

    def _restart(self, step: int, mb: int) -> None:
        st = self._steps[step]
        st.mbs[mb].version, st.mbs[mb].t_done = None, 0
        self.traj_version.pop((step, mb), None)
        st.fresh.appendleft(mb)
        self.stats["restarts"] += 1
        if step not in self._open:
            insort(self._open, step)

    def _key(self, ws: _W) -> int:
        return ws.version if ws.role == "rollout" else 0

    def _park(self, ws: _W) -> None:
        key = ws.version if ws.role == "rollout" else 0
        pools = self._idle[ws.role]
        pool = pools.get(key)
        if pool is None:
            pools[key] = {ws.id: None}
        else:
            pool[ws.id] = None

    def _unpark(self, ws: _W) -> None:
        pools = self._idle[ws.worker.role]
        key = self._key(ws)
        pool = pools.get(key)
        if pool is not None and ws.worker.id in pool:
            del pool[ws.worker.id]
            if not pool:
                del pools[key]

    def _pop_idle(self, role: str, key: int) -> Optional[_W]:
        pools = self._idle[role]
        pool = pools.get(key)
        if not pool:
            return None
        wid, _ = pool.popitem()
        if not pool:
            del pools[key]
        return self._w[wid]

    def describe(self) -> str:
        """One-line state summary (for deadlock messages and debugging)."""
        idle = {r: {v: len(p) for v, p in d.items()} for r, d in self._idle.items() if d}
        return (f"version={self.version} open_steps={self._open} opt_step={self._opt_step} "
                f"train_q={ {s: len(q) for s, q in self._train_q.items() if q} } "
                f"reward_q={len(self._reward_q)} "
                f"cont_q={ {v: len(q) for v, q in self._cont_q.items()} } "
                f"pinned={len(self._pinned)} idle={idle} busy={len(self.in_flight)}")

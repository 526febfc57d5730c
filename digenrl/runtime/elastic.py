"""Elastic rollout pools: the driver's side of `digenrl scale` (protocol: runtime/scale.py).

    EventLoop.run -- every iteration (ray.wait wakes at least every poll_s) --> Elastic.poll(loop)
        admit   rollout actors whose start-up finished join the scheduler (add_worker: their
                first unit is a WeightSync to the current version, then they generate); one
                not up within runtime.placement_timeout_s + start_timeout_s is stopped, and
                its join answered with an error: what each rank asks, what is free
        take    each request in DIR/scale/ once (at most every `every_s` seconds):
                  +N  start N actors (Actors.add_rollout: the options replace() uses);
                      they join when ready, so a model load never stalls the loop
                  -N  Scheduler.drain N workers (ones still starting first, then idle ones,
                      then the newest); each
                      leaves once its unit completes (EventLoop retires it: actor killed)
        answer  one JSON line per request, join and leave in DIR/scale.log; DIR/pools.json
                (the pools the CLI validates against) rewritten after every change
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from digenrl.runtime import scale
from digenrl.runtime.actors import Actors
from digenrl.runtime.cluster import actor_options
from digenrl.sched import SchedulerError, Worker

if TYPE_CHECKING:
    from digenrl.runtime.loop import EventLoop

log = logging.getLogger(__name__)


class Elastic:
    """Watches `run_dir` for scale requests while `loop` runs; pass `poll` and `left` to
    EventLoop (`poll`, `on_leave`)."""

    def __init__(self, actors: Actors, run_dir: Path, every_s: float = 0.5):
        self.actors, self.run_dir, self.every_s = actors, Path(run_dir), every_s
        self.can_add = any(w.role == "rollout" for w in actors.workers)  # trainer 0 publishes for them
        self.joining: dict[str, tuple[Worker, list, float]] = {}  # id -> (worker, its ranks' ready refs, deadline)
        rt = actors.cfg.runtime
        self.join_s = rt.placement_timeout_s + rt.start_timeout_s  # placed, then started
        self.loop: "EventLoop | None" = None
        self._last = 0.0

    def start(self, loop: "EventLoop") -> None:
        """Requests left from before this run are refused; then the run is open to scaling."""
        self.loop = loop
        for rid, req, err in scale.take(self.run_dir):
            scale.answer(self.run_dir, {"id": rid, "request": str(req) if req else None, "ok": False,
                                        "error": err or "written before this run started"})
        self._write_state()

    def close(self) -> None:
        """The run is over: no pools.json (the CLI refuses), actors still starting stopped."""
        self.loop = None
        for w, *_ in self.joining.values():
            self._stop(w)
        self.joining.clear()
        scale.clear_state(self.run_dir)

    # -- EventLoop.poll -------------------------------------------------------------------
    def poll(self, loop: "EventLoop") -> None:
        if self.joining:
            self._admit(loop)
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        for rid, req, err in scale.take(self.run_dir):
            self._apply(loop, rid, req, err)

    def left(self, worker: Worker, lost: bool = False) -> None:
        """A drained worker left (EventLoop retired it), or one of ours stopped (`_stop`)."""
        scale.answer(self.run_dir, {"left": worker.id, "lost": lost})
        log.warning("rollout worker %s %s", worker.id, "lost while draining" if lost else "drained and stopped")
        self._write_state()

    def grow(self, why: str) -> str:
        """Start one more rollout worker now, as `rollout=+1` does (it joins when its actors are
        up); `why` goes into scale.log (a spot replacement, the autoscaler). Returns its id."""
        w, ready = self.actors.add_rollout()
        self.joining[w.id] = (w, ready, time.monotonic() + self.join_s)
        scale.answer(self.run_dir, {"adding": [w.id], "why": why})
        log.warning("adding rollout worker %s: %s", w.id, why)
        self._write_state()
        return w.id

    def rollout_count(self, sched) -> int:
        """Rollout workers in the pool and not draining, plus those starting."""
        return len(self._active(sched)) + len(self.joining)

    # -- requests ---------------------------------------------------------------------------
    def _apply(self, loop, rid: str, req, err: str) -> None:
        rec = {"id": rid, "request": str(req) if req else None}
        if req is None:
            scale.answer(self.run_dir, {**rec, "ok": False, "error": err})
            return
        active = self._active(loop.sched)
        try:
            now, after = scale.check_request(req, self._state(loop.sched))
        except scale.ScaleError as e:
            scale.answer(self.run_dir, {**rec, "ok": False, "error": str(e)})
            return
        added, drained, errors = [], [], []
        for _ in range(after - now):
            w, ready = self.actors.add_rollout()
            self.joining[w.id] = (w, ready, time.monotonic() + self.join_s)
            added.append(w.id)
        if after < now:
            # workers still starting first (nothing to hand over), then idle ones (they leave
            # at once), then the newest
            for wid in list(self.joining)[::-1][: now - after]:
                w, *_ = self.joining.pop(wid)
                self._stop(w)
                drained.append(wid)
            busy = loop.sched.in_flight
            for wid in sorted(reversed(active), key=lambda wid: wid in busy)[: now - after - len(drained)]:
                try:
                    loop.drain(wid)
                    drained.append(wid)
                except SchedulerError as e:  # the scheduler's own refusal (see Scheduler.drain)
                    errors.append(str(e))
        ok = not errors
        scale.answer(self.run_dir, {**rec, "ok": ok, "before": now, "after": after, "adding": added,
                                    "draining": drained, **({"error": "; ".join(errors)} if errors else {})})
        log.warning("scale %s: %d -> %d rollout workers (adding %s, draining %s)", req, now, after, added, drained)
        self._write_state()

    def _admit(self, loop) -> None:
        """Actors whose every rank is up join the scheduler (WeightSync first); those past their
        deadline are stopped, and the request's join is answered with why."""
        for wid, (w, refs, deadline) in list(self.joining.items()):
            if len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
                if time.monotonic() > deadline:
                    del self.joining[wid]
                    pool = self.actors.cfg.runtime.rollout
                    asks = {k: v for k, v in actor_options(pool).items() if k.startswith(("num_", "acc", "res"))}
                    scale.answer(self.run_dir, {"joined": wid, "ok": False, "error": (
                        f"not up within {self.join_s:g} s (runtime.placement_timeout_s + start_timeout_s): "
                        f"never placed, or still loading; each rank asks {asks}, free now: "
                        f"{ray.available_resources()}")})
                    self._stop(w)
                continue
            del self.joining[wid]
            try:
                self.actors.admit(w, ray.get(refs))
            except Exception as e:  # the actor failed to start: the request is answered, the run goes on
                scale.answer(self.run_dir, {"joined": wid, "ok": False, "error": f"{type(e).__name__}: {e}"})
                self._stop(w)
                continue
            loop.join(w)
            scale.answer(self.run_dir, {"joined": wid, "ok": True})
            self._write_state()

    def _stop(self, worker: Worker) -> None:
        """Stop a worker that never joined the scheduler (still starting, or failed to)."""
        self.actors.retire(worker)
        self.left(worker)

    # -- state ------------------------------------------------------------------------------
    def _active(self, sched) -> list[str]:
        draining = set(sched.draining)
        return [w.id for w in sched.workers if w.role == "rollout" and w.id not in draining]

    def _state(self, sched) -> dict:
        return {"mode": sched.cfg.mode, "tag": sched.cfg.tag, "can_add_rollout": self.can_add,
                "rollout": self._active(sched), "draining": sched.draining,
                "joining": list(self.joining),
                "reward": [w.id for w in sched.workers if w.role == "reward"]}

    def _write_state(self) -> None:
        if self.loop is not None:
            scale.write_state(self.run_dir, self._state(self.loop.sched))

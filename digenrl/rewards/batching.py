"""Batching for the reward service: callers in many threads, one scorer thread that owns the reward.

    caller threads --submit()--> queue --> scorer thread --> reward(images, prompts)
                   <-- scores, or RequestError(500/503/504) -- waits <= timeout_s

Requests whose images share a shape are concatenated up to max_batch samples and scored in
one reward call; a larger request is scored in max_batch chunks. One scorer thread owns the
model, so rewards need not be thread-safe. A caller that times out gets a 504 at once; a
reward call already running cannot be interrupted, but requests whose deadline passed while
queued are dropped unscored. A reward that raises on a batch is re-run request by request,
so only the request that made it fail gets the 500.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from digenrl.rewards.base import Reward
from digenrl.rewards.wire import RequestError

log = logging.getLogger(__name__)


@dataclass
class _Job:
    images: torch.Tensor  # (B, ...) float32 in [0, 1]
    prompts: list[str]
    deadline: float  # time.monotonic()
    done: threading.Event = field(default_factory=threading.Event)
    scores: torch.Tensor | None = None
    error: str | None = None
    abandoned: bool = False  # its caller already gave up (504)


class RewardBatcher:
    """Scores requests from many threads with one reward, batching those that arrive together.

    `start()` runs the scorer thread; `submit()` blocks the calling thread until its scores
    are ready. At most `max_queued` requests wait; more are refused with a 503.
    """

    def __init__(self, reward: Reward, max_batch: int = 64, timeout_s: float = 120.0, max_queued: int = 256):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.reward, self.max_batch, self.timeout_s, self.max_queued = reward, max_batch, timeout_s, max_queued
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._pending: deque[_Job] = deque()  # taken off the queue by the scorer, not yet scored
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy = False  # a reward call is running (or about to)
        self.served = 0  # requests answered with scores

    def start(self) -> "RewardBatcher":
        self._thread = threading.Thread(target=self._score_loop, daemon=True, name="reward-scorer")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the scorer after its current reward call (waits up to 5 s for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def queued(self) -> int:
        """Requests waiting to be scored (not counting the batch being scored)."""
        return self._queue.qsize() + len(self._pending)

    def submit(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Queue a request and wait for its (B,) scores; RequestError(503/504/500) when it cannot be scored."""
        if self.queued >= self.max_queued:
            raise RequestError(503, "busy", f"{self.queued} requests already queued; retry later")
        job = _Job(images, prompts, deadline=time.monotonic() + self.timeout_s)
        self._queue.put(job)
        if not job.done.wait(self.timeout_s):
            job.abandoned = True
            message = f"reward {self.reward.name!r} did not score the request within {self.timeout_s} s"
            raise RequestError(504, "timeout", message)
        if job.error is not None:
            raise RequestError(500, "reward_failed", job.error)
        return job.scores

    def _score_loop(self) -> None:
        pending = self._pending
        while not self._stop.is_set():
            if not pending:
                try:
                    pending.append(self._queue.get(timeout=0.1))
                except queue.Empty:
                    continue
            while True:  # everything that arrived meanwhile may join this batch
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self.busy = True  # before the pending jobs leave `queued`, so a health check never shows idle
            try:
                now = time.monotonic()
                live = [j for j in pending if not j.abandoned and j.deadline > now]
                pending.clear()
                if not live:
                    continue
                # first come first served; same-shaped jobs join it up to max_batch samples
                first, batch, n = live[0], [live[0]], live[0].images.shape[0]
                for job in live[1:]:
                    if job.images.shape[1:] == first.images.shape[1:] and n + job.images.shape[0] <= self.max_batch:
                        batch.append(job)
                        n += job.images.shape[0]
                    else:
                        pending.append(job)
                self._score_batch(batch)
            finally:
                self.busy = False

    def _score_batch(self, batch: list[_Job]) -> None:
        try:
            scores = self._score(torch.cat([j.images for j in batch]), [p for j in batch for p in j.prompts])
        except Exception as e:  # noqa: BLE001 - the reward's failure goes back to the caller, not up
            if len(batch) > 1:  # find out which request it was: score them one by one
                for job in batch:
                    self._score_batch([job])
                return
            batch[0].error = f"reward {self.reward.name!r} raised {type(e).__name__}: {e}"
            log.exception("reward failed")
            batch[0].done.set()
            return
        start = 0
        for job in batch:
            job.scores = scores[start : start + job.images.shape[0]]
            start += job.images.shape[0]
            self.served += 1
            job.done.set()

    @torch.no_grad()
    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        outs = []
        for i in range(0, images.shape[0], self.max_batch):
            chunk = images[i : i + self.max_batch]
            out = torch.as_tensor(self.reward(chunk, prompts[i : i + self.max_batch])).float().cpu()
            if out.shape != (chunk.shape[0],):
                raise ValueError(f"returned shape {tuple(out.shape)} for {chunk.shape[0]} samples")
            outs.append(out)
        scores = torch.cat(outs)
        if not torch.isfinite(scores).all():
            raise ValueError("returned non-finite scores")
        return scores

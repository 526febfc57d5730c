"""Autoscaled rollout pools: ask Ray's autoscaler for nodes, add workers as they appear.

    start   ray.autoscaler.sdk.request_resources(bundles): one bundle per rank of every trainer
            and reward worker and of `max_workers` rollout workers (runtime.rollout.max_workers).
            A standing request of the cluster's total shape: the autoscaler (the cluster
            launcher's monitor, KubeRay's autoscaler sidecar, or the fake provider in tests)
            starts nodes until it fits, whatever is running now
    poll    every `every_s`: while the rollout pool (in it and not draining, plus starting) is
            below max_workers and the cluster has room for one more worker now, start one
            (`add`: Elastic.grow, the `digenrl scale rollout=+1` path; it joins when up, its
            first unit a WeightSync). A worker that drained on a spot notice, or was lost, is
            refilled the same way when the provider's replacement node comes up
    close   request_resources(bundles=[]): the request is withdrawn, so the autoscaler may
            remove the nodes the run no longer uses (after its idle timeout); a drained
            worker's actors are stopped when it leaves, so its node is idle from then on

The pool never drops below `runtime.rollout.workers` by this module's doing: it only adds.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Optional

from digenrl.config.runtime import PoolConfig
from digenrl.config.schema import Config
from digenrl.runtime.cluster import _bundle, fits_now

if TYPE_CHECKING:
    from digenrl.runtime.loop import EventLoop

log = logging.getLogger(__name__)


def pool_bundles(pool: PoolConfig, workers: int) -> list[dict]:
    """One bundle per rank of `workers` workers of `pool` (a gang of g ranks: g bundles each)."""
    bundle = _bundle(pool)
    return [dict(bundle) for _ in range(workers * pool.gang)] if bundle else []


def cluster_request(cfg: Config) -> list[dict]:
    """The bundles of the whole run with the rollout pool at runtime.rollout.max_workers."""
    rt = cfg.runtime
    return (pool_bundles(rt.trainer, rt.trainer.workers) + pool_bundles(rt.reward, rt.reward.workers)
            + pool_bundles(rt.rollout, rt.rollout.max_workers))


class Autoscaler:
    """Keeps the rollout pool at up to `max_workers` on an autoscaling cluster (module doc).

    count(loop): rollout workers in the pool or starting. add(why): start one. request: the
    autoscaler SDK's request_resources (tests pass a recorder). room(): is there room for
    one more rollout worker now (default: cluster.fits_now).
    """

    def __init__(self, cfg: Config, count: Callable[["EventLoop"], int], add: Callable[[str], str], *,
                 every_s: float = 1.0, request: Optional[Callable] = None,
                 room: Optional[Callable[[], bool]] = None):
        from ray.autoscaler.sdk import request_resources

        self.cfg, self.max = cfg, cfg.runtime.rollout.max_workers
        self.count, self.add, self.every_s = count, add, every_s
        self.request = request or request_resources
        self.room = room or (lambda: fits_now(cfg.runtime.rollout))
        self.added: list[str] = []
        self._last = 0.0

    def start(self) -> None:
        bundles = cluster_request(self.cfg)
        self.request(bundles=bundles)
        log.warning("asked Ray's autoscaler for %d bundles (rollout pool up to %d workers)", len(bundles), self.max)

    def poll(self, loop: "EventLoop") -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        n = self.count(loop)
        if n < self.max and self.room():  # one per poll: a starting worker holds nothing yet
            self.added.append(self.add(f"autoscaling: {n} of runtime.rollout.max_workers={self.max}"))

    def close(self) -> None:
        try:
            self.request(bundles=[])
        except Exception as e:  # the cluster went away first: nothing left to release
            log.warning("withdrawing the autoscaler request failed: %s", e)


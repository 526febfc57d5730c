"""Connecting to Ray and placing pools: PoolConfig -> actor options (+ placement groups).

    connect(cfg)               runtime.address, else $RAY_ADDRESS, else a local cluster sized
                               for the pools (an already-initialised Ray is used as is)
    session(address, pools)    the same as a context: shuts down a cluster it started
    actor_options(pool)        num_cpus / num_gpus / accelerator_type / custom resources
    PoolPlacement(pool, n)     the trainer pool in one PACK placement group (gradient
                               all-reduce stays on as few nodes as possible)
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Optional

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from digenrl.config.schema import PoolConfig

PLACEMENT_TIMEOUT_S = 120.0


def connect(address: Optional[str], pools: list[tuple[PoolConfig, int]]) -> bool:
    """Make sure Ray is up; returns True when this call started a local cluster."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, include_dashboard=False, log_to_driver=True)
        return False
    cpus = sum(p.num_cpus * n for p, n in pools)
    gpus = sum(p.num_gpus * n for p, n in pools)
    custom: dict[str, float] = {}
    for p, n in pools:
        for k, v in p.resources.items():
            custom[k] = custom.get(k, 0.0) + v * n
        if p.accelerator:  # a local cluster has no accelerator labels: provide them
            key = f"accelerator_type:{p.accelerator}"
            custom[key] = custom.get(key, 0.0) + 1.0
    ray.init(num_cpus=max(int(-(-cpus // 1)), os.cpu_count() or 1),
             num_gpus=int(-(-gpus // 1)) if gpus else None, resources=custom or None,
             include_dashboard=False, log_to_driver=True)
    return True


@contextmanager
def session(address: Optional[str] = None, pools: list[tuple[PoolConfig, int]] = ()) -> Iterator[None]:
    """`connect`, and `ray.shutdown()` on exit when this call started the cluster."""
    started = connect(address, list(pools))
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def actor_options(pool: PoolConfig) -> dict:
    opts = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus, "max_restarts": 0,
            "max_task_retries": 0}
    if pool.accelerator:
        opts["accelerator_type"] = pool.accelerator
    if pool.resources:
        opts["resources"] = dict(pool.resources)
    return opts


def _bundle(pool: PoolConfig) -> dict:
    b = {"CPU": pool.num_cpus}
    if pool.num_gpus:
        b["GPU"] = pool.num_gpus
    if pool.accelerator:
        b[f"accelerator_type:{pool.accelerator}"] = 0.001
    b.update(pool.resources)
    return {k: v for k, v in b.items() if v}


class PoolPlacement:
    """One bundle per worker of `pool`, PACK strategy; `options(i)` places worker i."""

    def __init__(self, pool: PoolConfig, n: int, name: str):
        bundles = [_bundle(pool) for _ in range(n)]
        self.pg = None
        if not all(bundles):  # zero-resource workers cannot be placed in bundles
            return
        self.pg = placement_group(bundles, strategy="PACK", name=name)
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            remove_placement_group(self.pg)
            raise RuntimeError(
                f"pool {name!r}: the cluster cannot place {n} workers of {bundles[0]} within "
                f"{PLACEMENT_TIMEOUT_S:.0f}s; available: {ray.available_resources()}. "
                f"Lower runtime.{name}.workers / num_cpus / num_gpus or add nodes.")

    def options(self, pool: PoolConfig, i: int) -> dict:
        opts = actor_options(pool)
        if self.pg is not None:
            opts.pop("accelerator_type", None)  # reserved by the bundle
            opts.pop("resources", None)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_bundle_index=i)
        return opts

    def remove(self) -> None:
        if self.pg is not None:
            remove_placement_group(self.pg)

"""Connecting to Ray and placing pools: PoolConfig -> actor options (+ placement groups).

    connect(cfg)               runtime.address, else $RAY_ADDRESS, else a local cluster sized
                               for the pools (an already-initialised Ray is used as is)
    session(address, pools)    the same as a context: shuts down a cluster it started
    actor_options(pool)        num_cpus / num_gpus / accelerator_type / custom resources
    PoolPlacement(pool, n)     the trainer pool's single-device workers in one PACK placement
                               group (gradient all-reduce stays on as few nodes as possible)
    GangPlacement(pool, gang)  one multi-device worker: its ranks on one node (STRICT_PACK)
                               wherever a node holds the gang, across nodes (PACK) only when none
                               does; created before any single-device actor, so that loose
                               workers fill what the gangs leave rather than split them
    network_options(name)      runtime_env pointing gloo and NCCL at interface `name`
    interface_ip(name)         this node's IPv4 address on `name` (Ray's node IP when None)
"""

from __future__ import annotations

import os
import socket
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


def network_options(interface: Optional[str]) -> dict:
    """Actor options that point gloo's and NCCL's sockets at `interface` (runtime.network_interface)."""
    if interface is None:
        return {}
    return {"runtime_env": {"env_vars": {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}}}


def interface_ip(interface: Optional[str]) -> str:
    """The address this node's process groups and relay listen on: `interface`'s IPv4 address,
    or Ray's node IP when no interface is named."""
    if interface is None:
        return ray.util.get_node_ip_address()
    import psutil

    addrs = psutil.net_if_addrs()
    for a in addrs.get(interface, ()):
        if a.family == socket.AF_INET:
            return a.address
    raise RuntimeError(f"runtime.network_interface={interface!r}: node {socket.gethostname()} has no IPv4 "
                       f"address on it; its interfaces: {', '.join(sorted(addrs))}")


def _wait_placed(pg, what: str, bundles: list[dict]) -> None:
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(pg)
        raise RuntimeError(
            f"{what}: the cluster cannot place {len(bundles)} x {bundles[0]} within "
            f"{PLACEMENT_TIMEOUT_S:.0f}s; available: {ray.available_resources()}")


class PoolPlacement:
    """One bundle per worker of `pool`, PACK strategy; `options(i)` places worker i."""

    def __init__(self, pool: PoolConfig, n: int, name: str):
        bundles = [_bundle(pool) for _ in range(n)]
        self.pg = None
        if not all(bundles):  # zero-resource workers cannot be placed in bundles
            return
        self.pg = placement_group(bundles, strategy="PACK", name=name)
        _wait_placed(self.pg, f"pool {name!r} (lower runtime.{name}.workers / num_cpus / num_gpus or add "
                     "nodes)", bundles)

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


def node_holds(bundle: dict) -> int:
    """How many `bundle`s the largest alive node of the cluster holds (its total resources)."""
    best = 0
    for node in ray.nodes():
        if node.get("Alive"):
            have = node.get("Resources", {})
            best = max(best, min(int(have.get(k, 0.0) / v + 1e-9) for k, v in bundle.items()))
    return best


class GangPlacement(PoolPlacement):
    """One worker's `gang` ranks: on one node where some node holds them all (STRICT_PACK: a
    gang's FSDP gathers or sequence-parallel all-to-alls stay on the intra-node link), packed on
    as few nodes as possible otherwise. `options(pool, r)` places rank r."""

    def __init__(self, pool: PoolConfig, gang: int, name: str):
        bundle = _bundle(pool)
        self.pg, self.straddles = None, False
        if not bundle:
            return
        self.straddles = node_holds(bundle) < gang
        bundles = [bundle] * gang
        self.pg = placement_group(bundles, strategy="PACK" if self.straddles else "STRICT_PACK", name=name)
        _wait_placed(self.pg, f"gang {name!r} ({'across nodes' if self.straddles else 'on one node'}; "
                     "lower the pool's gang / num_cpus / num_gpus or add nodes)", bundles)

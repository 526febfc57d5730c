"""Connecting to Ray and placing pools: PoolConfig -> actor options (+ placement groups).

    connect(cfg)               runtime.address, else $RAY_ADDRESS, else a local cluster sized
                               for the pools (an already-initialised Ray is used as is); the
                               address "local" (Ray's word for "start a local instance") is that
                               sized local cluster too; an address where nothing answers is
                               refused within CONNECT_TIMEOUT_S
    cluster_address(address)   the existing cluster to join, or None (start a local one)
    _check_token(address)      a cluster that wants Ray's token (RAY_AUTH_MODE=token) this process
                               does not have: ClusterRefused at once, saying how to give it
    session(address, pools)    the same as a context: shuts down a cluster it started
    actor_options(pool)        num_cpus / num_gpus / accelerator_type / custom resources
    PoolPlacement(pool, n)     the trainer pool's single-device workers in one PACK placement
                               group (gradient all-reduce stays on as few nodes as possible)
    GangPlacement(pool, gang)  one multi-device worker: its ranks on one node (STRICT_PACK)
                               wherever a node holds the gang, across nodes (PACK) only when none
                               does; placed before the pools of single-device workers, so that
                               those fill what the gangs leave rather than split them
    await_room(pool, n)        wait until the cluster can place n workers of a pool that are
                               placed one by one (rollout, reward), then let go
    shortfall(pool, n)         which resources of a worker the cluster lacks, or has too few free
    network_options(name)      runtime_env pointing gloo and NCCL at interface `name`
    interface_ip(name)         this node's IPv4 address on `name` (Ray's node IP when None)

Every wait here has a deadline (runtime.placement_timeout_s) and gives up with WaitTimeout
(runtime/waits.py) naming the resources asked for and those missing. A placement that can never
succeed (a worker larger than every node, or more of a resource than the cluster has in all) on
a cluster that cannot grow (no autoscaler: `can_grow`) is refused at once with the same message,
without waiting for the deadline (`refuse_if_infeasible`). A replacement for a lost worker
waits out its deadline either way: a node that left may come back.
"""

from __future__ import annotations

import json
import os
import re
import socket
from contextlib import contextmanager
from typing import Iterator, Optional

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from digenrl.config.runtime import PoolConfig
from digenrl.runtime.waits import Unplaceable, WaitTimeout

# ray.init at an address where nothing listens retries for minutes with only log lines; a
# TCP connection to the head's port first says so at once (refused) or after this many seconds.
CONNECT_TIMEOUT_S = 30.0


def cluster_address(address: Optional[str]) -> Optional[str]:
    """The existing cluster to join: `address` (runtime.address), else $RAY_ADDRESS. None, start a
    local cluster, when neither is set or it is "local": Ray's own docs use RAY_ADDRESS=local for
    "start a local instance", and the run's own is sized for its pools."""
    address = (address or os.environ.get("RAY_ADDRESS") or "").strip()
    return None if address.lower() in ("", "local") else address


def connect(address: Optional[str], pools: list[tuple[PoolConfig, int]]) -> bool:
    """Make sure Ray is up; returns True when this call started a local cluster."""
    global _started_here
    if ray.is_initialized():
        return False
    address = cluster_address(address)
    if address:
        _check_reachable(address)
        _check_token(address)
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
    # address "local": a new instance, never one a `ray start` left on this machine (which
    # ray.init without an address would join), and never $RAY_ADDRESS's "local" left unsized
    ray.init(address="local", num_cpus=max(int(-(-cpus // 1)), os.cpu_count() or 1),
             num_gpus=int(-(-gpus // 1)) if gpus else None, resources=custom or None,
             include_dashboard=False, log_to_driver=True)
    _started_here = ray.get_runtime_context().gcs_address
    return True


_started_here: Optional[str] = None  # the GCS address of the local cluster connect() started: it cannot grow


def _check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise WaitTimeout when nothing accepts a TCP connection at `address` ("host:port" or
    "ray://host:port"; "auto", "local" and addresses without a port are left to ray.init)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise WaitTimeout(f"Ray cluster at {address!r} (runtime.address, else $RAY_ADDRESS): nothing "
                          f"answers at {host}:{port} ({e}); start it (`ray start --head --port={port}`), "
                          "fix the address, or unset both to start a local cluster") from None


class ClusterRefused(RuntimeError):
    """The cluster at the address refused this driver (Ray's token authentication)."""


TOKEN_HELP = ("set RAY_AUTH_MODE=token and give the cluster's token in RAY_AUTH_TOKEN, or in a file named by "
              "RAY_AUTH_TOKEN_PATH (or ~/.ray/auth_token), as on the cluster's nodes")


def _check_token(address: str) -> None:
    """Refuse at once, saying so, a cluster that wants a token this process does not have.

    Ray's token authentication (Ray >= 2.52: RAY_AUTH_MODE=token on the cluster): a driver
    without the token, or with another, is answered "Unauthenticated", which ray.init retries
    for about 20 s with a log line a second, then reports as a failed connection; with
    RAY_AUTH_MODE=token and no token at all, Ray's GCS client aborts the process. One GCS
    client, made after the token is known to be there, asks once."""
    try:
        from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray without token authentication
        return
    gcs = address.removeprefix("ray://")
    if ":" not in gcs or gcs.startswith("auto"):  # "auto" and such: left to ray.init
        return
    try:
        ensure_token_if_auth_enabled(None, create_token_if_missing=False)
        GcsClient(address=gcs)
    except AuthenticationError as e:
        mode = os.environ.get("RAY_AUTH_MODE", "")
        if mode == "token" and "no authentication token" in str(e).lower():
            why = "this driver has RAY_AUTH_MODE=token but no token to send"
        elif mode == "token":
            why = "it refused this driver's token, which is not the cluster's"
        else:
            why = "it refused this driver, which sends no token (RAY_AUTH_MODE is not token): the cluster wants Ray's token"
        raise ClusterRefused(f"Ray cluster at {address!r} (runtime.address, else $RAY_ADDRESS): {why}. "
                             f"To join it, {TOKEN_HELP}") from None
    except Exception:  # noqa: BLE001 - anything else: ray.init says it (unreachable was checked above)
        return


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
    """The resources one worker (one rank) of `pool` asks for, as a placement-group bundle."""
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


def shortfall(pool: PoolConfig, n: int) -> str:
    """Why the cluster cannot place `n` workers of `pool` now: each resource that no alive node
    has enough of for one worker, and each that the nodes have but not `n` times free."""
    bundle = _bundle(pool)
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    free = ray.available_resources()
    missing, busy = [], []
    for k, v in bundle.items():
        most = max((r.get(k, 0.0) for r in nodes), default=0.0)
        if most < v:
            missing.append(f"{k} (one worker asks {v:g}; " + (f"the largest node has {most:g})" if most
                                                              else "no node has it)"))
        elif free.get(k, 0.0) < n * v:
            busy.append(f"{k} ({n} x {v:g} asked, {free.get(k, 0.0):g} free)")
    if missing:
        return "the cluster lacks " + ", ".join(missing)
    if busy:
        return "in use by other workers or jobs: " + ", ".join(busy)
    return f"no node has all of one worker's resources free at once (free: {_rounded(free)})"


def _rounded(resources: dict) -> dict:
    """The resources a pool can ask for (no node ids, placement-group shares or memory bytes)."""
    return {k: round(v, 3) for k, v in sorted(resources.items())
            if not k.startswith("node:") and "_group_" not in k and k not in ("memory", "object_store_memory")}


def _placement_error(name: str, pool: PoolConfig, n: int, timeout_s: float, how: str,
                     never: Optional[str] = None) -> WaitTimeout:
    """The placement's WaitTimeout: past its deadline (`timeout_s`), or at once when it can `never`
    succeed (why, from `infeasible`)."""
    bundle = _bundle(pool)
    when = (f"at all, so it is not waited for: {never}" if never else
            f"within {timeout_s:g} s (runtime.placement_timeout_s); {shortfall(pool, n)}")
    return (Unplaceable if never else WaitTimeout)(
        f"pool {name!r}: the cluster cannot place {n} worker{'s' * (n != 1)} of {bundle} ({how}) {when}. Cluster: "
        f"{_rounded(ray.cluster_resources())}. Ask for less ({_pool_key(name)}.workers / num_cpus / num_gpus / "
        "accelerator / resources), or add nodes that have it")


def infeasible(bundle: dict, n: int, strategy: str, nodes: list[dict]) -> Optional[str]:
    """Why `n` copies of `bundle`, placed with `strategy`, can never fit nodes whose total resources
    are `nodes` (however free they become), or None when they might. Certain cases only: one
    worker larger than every node; all of them together (STRICT_PACK: on one node) more of a
    resource than the cluster (that node) has in all."""
    missing = []
    for k, v in bundle.items():
        most = max((r.get(k, 0.0) for r in nodes), default=0.0)
        if most < v:
            missing.append(f"{k} (one worker asks {v:g}; " + (f"the largest node has {most:g})" if most
                                                              else "no node has it)"))
    if missing:
        return "the cluster lacks " + ", ".join(missing)
    if strategy == "STRICT_PACK":
        if not any(all(r.get(k, 0.0) >= n * v - 1e-9 for k, v in bundle.items()) for r in nodes):
            return f"no node holds {n} x {bundle} at once"
        return None
    over = [f"{k} ({n} x {v:g} asked, {sum(r.get(k, 0.0) for r in nodes):g} in all)"
            for k, v in bundle.items() if sum(r.get(k, 0.0) for r in nodes) < n * v - 1e-9]
    return "the cluster has too little " + ", ".join(over) if over else None


def node_totals() -> list[dict]:
    """Each alive node's total resources."""
    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]


_READONLY_NODE_TYPE = re.compile(r"node_[0-9a-f]{56}")  # Ray's name for a node of a cluster with no autoscaler


def can_grow() -> bool:
    """Could the cluster get nodes it does not have: False for the local cluster `connect` started,
    and for one whose monitor runs no autoscaler (Ray's "readonly" provider, which names each node
    type after a node id: `ray start` clusters); True for autoscaler v2 (KubeRay), for a v1
    autoscaler with node types of its own (`ray up`), and when it cannot tell (the monitor has not
    reported yet): then the placement's deadline decides, as before."""
    if _started_here is not None and _started_here == ray.get_runtime_context().gcs_address:
        return False
    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2

        if is_autoscaler_v2(fetch_from_server=True):
            return True
        from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
        from ray.experimental.internal_kv import _internal_kv_get

        status = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
        report = json.loads(status).get("autoscaler_report") if status else None
    except Exception:  # noqa: BLE001 - Ray internals moved: assume it may grow (the deadline decides)
        return True
    if not report:
        return True
    types = set(report.get("active_nodes") or {}) | set((report.get("node_type_mapping") or {}).values())
    types |= set(report.get("pending_launches") or {})
    return not types or not all(_READONLY_NODE_TYPE.fullmatch(t) for t in types)


def refuse_if_infeasible(pool: PoolConfig, n: int, strategy: str, name: str, timeout_s: float, how: str) -> None:
    """Raise the placement's WaitTimeout now when it can never succeed on this cluster: `infeasible`
    on the nodes' totals, and no autoscaler could add nodes (`can_grow`)."""
    why = infeasible(_bundle(pool), n, strategy, node_totals())
    if why is not None and not can_grow():
        raise _placement_error(name, pool, n, timeout_s, how, never=f"{why}, and no autoscaler can add nodes")


def _pool_key(name: str) -> str:
    """The config section of the pool a placement is for ("rollout", "colocated", "reward (...)")."""
    role = name.split(" ")[0]
    return "runtime.trainer" if role == "colocated" else f"runtime.{role}"


def await_room(pool: PoolConfig, n: int, name: str, timeout_s: float, keep: bool = False,
               wait_for_nodes: bool = False):
    """Wait until the cluster can place `n` workers of `pool`, each on any node (SPREAD), or raise
    WaitTimeout naming what is missing. The probe is a placement group: the workers themselves
    are placed one by one, so that each can be replaced on its own. It is removed at once, or
    with `keep` returned (None if there was nothing to place), so that the room stays taken
    while other pools are placed; the caller removes it (`remove_placement_group`). A placement
    that can never succeed is refused at once, unless `wait_for_nodes` (a replacement: the
    node that left may come back)."""
    bundle = _bundle(pool)
    if not bundle or n == 0:  # a worker that asks for nothing is placed anywhere
        return None
    if not wait_for_nodes:
        refuse_if_infeasible(pool, n, "SPREAD", name, timeout_s, "each on any node")
    pg = placement_group([bundle] * n, strategy="SPREAD", name=f"{name}-probe")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready or not keep:
        remove_placement_group(pg)
    if not ready:
        raise _placement_error(name, pool, n, timeout_s, "each on any node")
    return pg if keep else None


def fits_now(pool: PoolConfig) -> bool:
    """Are the resources one worker of `pool` asks for free now, cluster-wide (not per node)?"""
    free = ray.available_resources()
    return all(free.get(k, 0.0) >= v for k, v in _bundle(pool).items())


class PoolPlacement:
    """One bundle per worker of `pool`, PACK strategy; `options(i)` places worker i. Waits up to
    `timeout_s` for the group, then raises WaitTimeout naming the missing resources."""

    straddles = False  # a gang spread over nodes (GangPlacement)

    def __init__(self, pool: PoolConfig, n: int, name: str, timeout_s: float):
        bundles = [_bundle(pool) for _ in range(n)]
        self.pg = None
        if not all(bundles):  # zero-resource workers cannot be placed in bundles
            return
        self._place(bundles, "PACK", pool, name, timeout_s, "one placement group, packed")

    def _place(self, bundles: list[dict], strategy: str, pool: PoolConfig, name: str, timeout_s: float,
               how: str, wait_for_nodes: bool = False) -> None:
        if not wait_for_nodes:
            refuse_if_infeasible(pool, len(bundles), strategy, name, timeout_s, how)
        self.pg = placement_group(bundles, strategy=strategy, name=name)
        ready, _ = ray.wait([self.pg.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.pg)
            raise _placement_error(name, pool, len(bundles), timeout_s, how)

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
    as few nodes as possible otherwise (`straddles`). `options(pool, r)` places rank r."""

    def __init__(self, pool: PoolConfig, gang: int, name: str, timeout_s: float, wait_for_nodes: bool = False):
        bundle = _bundle(pool)
        self.pg = None
        if not bundle:
            return
        self.straddles = node_holds(bundle) < gang
        self._place([bundle] * gang, "PACK" if self.straddles else "STRICT_PACK", pool, name, timeout_s,
                    "across nodes, packed" if self.straddles else "on one node", wait_for_nodes)

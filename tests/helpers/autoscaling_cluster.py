"""A Ray cluster on this machine whose autoscaler starts, replaces and stops fake nodes.

Ray's own `ray.cluster_utils.AutoscalingCluster` runs `ray stop --force` first, which stops
every Ray process on the machine (other test runs' clusters too), and it reads a YAML file
that Ray's wheel does not ship. This starts the same thing as a `ray.cluster_utils.Cluster`
head, which owns its processes and stops only them: the head runs the autoscaler's monitor
with Ray's fake node provider, whose nodes are raylet processes on this machine. Nodes of type
`spot` carry the custom resource `spot: 1`.

The monitor is Ray's autoscaler v2 (RAY_enable_autoscaler_v2=1), the one KubeRay runs, because
the v1 autoscaler never replaces a fake node that died: with node updaters off, as the fake
provider needs, a node stays `uninitialized` and v1 terminates only up-to-date nodes that miss
heartbeats (measured: a killed node still listed and not replaced 90 s on). v2 reconciles its
instances with the GCS's view: a dead node is terminated and another launched for the request
(6 s here). The provider is named as an `external` module because v2 fills in a provider's
defaults from that YAML file for `type: fake_multinode`.

A node is reclaimed as a provider reclaims a spot VM: `reclaim` kills its raylet, and with it
the node. The GCS finds it dead within a few seconds (a health check every second, 3 misses in
a row; Ray's defaults take about 15 s). Each check allows 3 s for an answer, so a raylet slowed
by a loaded machine is not taken for dead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from typing import Iterator


FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider"
HEAD_ID = "f" * 51 + "00000"  # the provider's name for the head; its nodes are ...00001, ...00002


def _config(gcs_address: str, head_cpus: int, spot_cpus: int, max_spot: int) -> dict:
    """The cluster launcher's config, as the fake provider reads it (no files, no commands)."""
    return {
        "cluster_name": "digenrl-spot-test",
        "max_workers": max_spot,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.1,  # an unused node goes after 6 s
        "provider": {"type": "external", "module": f"{FAKE_PROVIDER}.FakeMultiNodeProvider",
                     "use_node_id_as_ip": True, "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": gcs_address, "launch_multiple": True, "head_node_id": HEAD_ID},
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
            "spot": {"resources": {"CPU": spot_cpus, "spot": 1}, "node_config": {}, "min_workers": 0,
                     "max_workers": max_spot},
        },
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


def reclaim(raylet_pid: int) -> None:
    """The provider takes a node back, as a cloud stops a VM: the node's processes (the raylet's
    children: its workers and agents) and its raylet are killed at once. Killing the raylet
    alone is not enough: a worker notices its raylet's end only later, and a unit in flight on
    it may still finish and return its result straight to its caller."""
    children = [pid for pid in _pids() if parent_pid(pid) == raylet_pid]
    for pid in [*children, raylet_pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def parent_pid(pid: int) -> int:
    """`pid`'s parent process (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def wait_for(condition, timeout_s: float, every_s: float = 0.5) -> bool:
    """Poll `condition()` until true or `timeout_s` (a failure bound, not a synchronisation)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


@contextlib.contextmanager
def autoscaling_cluster(head_cpus: int = 2, spot_cpus: int = 1, max_spot: int = 3) -> Iterator[str]:
    """Start the head (no spot node yet), connect this process to it, yield its address; on
    exit disconnect and stop the head (its monitor stops the fake nodes' provider with it)."""
    import ray
    from ray._private.services import get_node_ip_address
    from ray.cluster_utils import Cluster

    with socket.socket() as s:  # a free port for the GCS: the fake nodes are told it up front
        s.bind(("", 0))
        port = s.getsockname()[1]
    address = f"{get_node_ip_address()}:{port}"
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_enable_autoscaler_v2": "1"}
    head = {"RAY_CLOUD_INSTANCE_ID": HEAD_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": HEAD_ID}  # the head's only
    saved = {k: os.environ.get(k) for k in {**env, **head}}
    os.environ.update({**env, **head})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(_config(address, head_cpus, spot_cpus, max_spot), f)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": head_cpus, "gcs_server_port": port, "autoscaling_config": f.name,
            "include_dashboard": False, "_system_config": {
                "health_check_period_ms": 1000, "health_check_timeout_ms": 3000,
                "health_check_failure_threshold": 3}})
        for k in head:
            _restore(k, saved[k])
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster.address
    finally:
        if ray.is_initialized():
            # no request left: the autoscaler stops the fake nodes (their raylets are the
            # monitor's children, not the head's), then the head goes
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[])
            wait_for(lambda: ray.cluster_resources().get("spot", 0) == 0, 60)
            ray.shutdown()
        if cluster is not None:
            session = cluster.head_node.get_session_dir_path()
            cluster.shutdown()
            _kill_left(session)
        os.unlink(f.name)
        for k, v in saved.items():
            _restore(k, v)


def _restore(key: str, value) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def _kill_left(session_dir: str) -> None:
    """Kill what the cluster left running: a fake node the autoscaler had not yet stopped when
    the head went (its processes name the cluster's session directory)."""
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if session_dir.encode() in f.read():
                    os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass

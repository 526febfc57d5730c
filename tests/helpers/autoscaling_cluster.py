"""A Ray cluster on this machine whose autoscaler starts and stops fake nodes.

Ray's own `ray.cluster_utils.AutoscalingCluster` runs `ray stop --force` first, which stops
every Ray process on the machine (other test runs' clusters too), and it reads a YAML file
that Ray's wheel does not ship. This starts the same thing as a `ray.cluster_utils.Cluster`
head, which owns its processes and stops only them: the head runs the autoscaler's monitor
with Ray's fake node provider (`provider.type: fake_multinode`), whose nodes are raylet
processes on this machine. Nodes of type `spot` carry the custom resource `spot: 1`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import time
from typing import Iterator


def _config(gcs_address: str, head_cpus: int, spot_cpus: int, max_spot: int) -> dict:
    """The cluster launcher's config, as the fake provider reads it (no files, no commands)."""
    return {
        "cluster_name": "digenrl-spot-test",
        "max_workers": max_spot,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 0.1,  # an unused node goes after 6 s
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": gcs_address},
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
    env = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}  # read by the monitor process
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(_config(address, head_cpus, spot_cpus, max_spot), f)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": head_cpus, "gcs_server_port": port, "autoscaling_config": f.name,
            "include_dashboard": False})
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
            cluster.shutdown()
        os.unlink(f.name)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

"""One local Ray cluster for the whole test run.

Starting a cluster costs ~4 s and stopping it ~1.5 s on a 2-core machine; a cluster per test
module paid that a dozen times per run. Modules instead enter `shared_ray_cluster()`, which
starts the cluster if none is up and leaves it running for the next module. After a module,
a cluster whose CPUs are not all free again (an actor or placement group a failed test left
behind) is shut down, so that no module waits on a leak from another; the next module starts
a fresh one. The session's end shuts down whatever is left (`atexit`, registered by Ray's own
`ray.init`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

NUM_CPUS = 4
RAY_ARGS = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)


def _all_cpus_free(ray) -> bool:
    """True when every CPU of the cluster is available (no actor or placement group holds one)."""
    total = ray.cluster_resources().get("CPU", 0.0)
    return ray.available_resources().get("CPU", 0.0) >= total


@contextlib.contextmanager
def shared_ray_cluster() -> Iterator[None]:
    import ray

    if not ray.is_initialized():
        # "local": a cluster of our own, never one found on the machine (another run's `ray start`,
        # RAY_ADDRESS), which refuses num_cpus
        ray.init(address="local", num_cpus=NUM_CPUS, **RAY_ARGS)
    try:
        yield
    finally:
        if ray.is_initialized() and not _all_cpus_free(ray):
            ray.shutdown()


def leave_shared_ray_cluster() -> None:
    """Shut the shared cluster down, for a module that starts a cluster of its own."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def own_ray_cluster(**kwargs) -> None:
    """Replace the shared cluster by one of another shape (`ray.init(**kwargs)`)."""
    import ray

    leave_shared_ray_cluster()
    ray.init(**{**RAY_ARGS, **kwargs})

import os

import pytest
import torch

from tests.helpers.ray_cluster import shared_ray_cluster

# Tests share 2 cores with each other's processes: one intra-op thread keeps timings sane.
torch.set_num_threads(int(os.environ.get("DIGENRL_TEST_THREADS", "1")))


@pytest.fixture
def tiny_overrides(tmp_path):
    """A very small local run: 4 groups of 4, 6 denoising steps, no TensorBoard."""
    return [
        f"run.run_dir={tmp_path / 'run'}",
        "run.mode=local",
        "run.tensorboard=false",
        "data.groups_per_step=4",
        "data.group_size=4",
        "data.micro_batch_groups=2",
        "data.eval_max_prompts=4",
        "sampling.num_steps=6",
        "sampling.eval_num_steps=6",
        "reward.threads=1",
    ]


@pytest.fixture(scope="module")
def ray_cluster():
    """The test run's one local Ray cluster (4 CPUs), started by the first module that asks.

    A module that needs a cluster of another shape (Serve's 2 CPUs, two nodes) shuts this one
    down; the next module that asks starts it again. See tests/helpers/ray_cluster.py.
    """
    with shared_ray_cluster():
        yield

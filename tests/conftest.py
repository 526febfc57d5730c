import os

import pytest
import torch

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

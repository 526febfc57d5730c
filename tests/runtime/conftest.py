"""Ray runtime tests: tiny runs (4 groups x 2 samples) on the test run's shared Ray cluster
(`ray_cluster`, tests/conftest.py)."""

import pytest

from digenrl.config.schema import load_config
from digenrl.train.trainer import Trainer

ray = pytest.importorskip("ray")


def tiny(run_dir, mode="gap", *extra, steps=2):
    """Overrides of a tiny run: 4 groups of 2 samples, micro-batches of 1 group, 4 denoising steps."""
    return [
        f"run.run_dir={run_dir}",
        f"run.mode={mode}",
        "run.tensorboard=false",
        f"train.steps={steps}",
        "run.eval_every=0",
        "data.groups_per_step=4",
        "data.group_size=2",
        "data.micro_batch_groups=1",
        "data.eval_max_prompts=2",
        "data.eval_samples=1",
        "sampling.num_steps=4",
        "sampling.eval_num_steps=4",
        "reward.threads=1",
        "runtime.rollout.workers=1",
        "runtime.trainer.workers=1",
        *extra,
    ]


@pytest.fixture(scope="session")
def local_run(tmp_path_factory):
    """The single-device reference every on-policy mode must match: 2 steps, mode=local."""
    run = tmp_path_factory.mktemp("local")
    Trainer(load_config(None, tiny(run, "local")), progress=False).train()
    return run

import os
import sys

# Compile each module once per run, not once per process: with PYTHONDONTWRITEBYTECODE set (some
# sandboxes and CI images set it), every xdist worker and every Ray actor (which inherit this
# environment) compiled the package's sources again. Before torch, so its lazy imports benefit.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers.ray_cluster import shared_ray_cluster  # noqa: E402

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


# -- the order files reach the workers ----------------------------------------------------------
# `-n auto --dist loadfile` (pyproject.toml) gives each worker whole files, two queued ahead, in
# the order they are collected; the longest files first leave short ones for the end, so no
# worker sits idle while another runs a Ray file alone. tests/durations.json holds each file's
# seconds from one default-tier run; refresh it with `pytest --record-durations tests/durations.json`.
# A file it does not list counts DEFAULT_S (new files run mid-queue).
DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")
DEFAULT_S = 1.0


def pytest_addoption(parser):
    parser.addoption("--record-durations", metavar="PATH", default=None,
                     help="write each test file's total seconds (setup, call, teardown) to PATH as JSON")


def pytest_collection_modifyitems(config, items):
    import json

    try:
        with open(DURATIONS) as f:
            seconds = json.load(f)
    except FileNotFoundError:
        return
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)
    # stable: a file's tests keep their order; equal files keep collection order
    items.sort(key=lambda it: (-seconds.get(it.nodeid.split("::")[0], DEFAULT_S), first[it.nodeid.split("::")[0]]))


_recorded: dict = {}


def pytest_runtest_logreport(report):
    _recorded[report.nodeid.split("::")[0]] = _recorded.get(report.nodeid.split("::")[0], 0.0) + report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--record-durations")
    if path and not hasattr(session.config, "workerinput"):  # the controller sees every worker's reports
        import json

        with open(path, "w") as f:
            json.dump({k: round(v, 2) for k, v in sorted(_recorded.items())}, f, indent=0, sort_keys=True)
            f.write("\n")

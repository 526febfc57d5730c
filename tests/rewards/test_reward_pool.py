"""The Ray reward pool: local Ray with 2 CPUs, a trivial reward, an actor killed mid-run."""

import sys
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from digenrl.runtime.reward_pool import RewardPool  # noqa: E402

pytestmark = pytest.mark.timeout(120)


class Brightness:
    """Mean pixel (of images or whole videos) + 0.01 per prompt character."""

    name = "brightness"

    def __call__(self, images, prompts):
        return local_scores(images, prompts)


def local_scores(images, prompts):
    return images.flatten(1).mean(dim=1) + torch.tensor([0.01 * len(p) for p in prompts])


@pytest.fixture(scope="module")
def ray_local():
    # tests/ is not importable in Ray workers: ship this module's classes by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_pool_matches_local_and_survives_actor_death(ray_local):
    start = time.monotonic()
    with RewardPool(Brightness, num_workers=2, num_cpus=1, max_restarts=2, max_task_retries=2) as pool:
        assert pool.name == "brightness"
        batches = [(torch.rand(3, 3, 8, 8), ["a", "bb", "ccc"]) for _ in range(6)]
        batches.append((torch.rand(2, 4, 3, 8, 8), ["video", "v"]))  # a video batch
        refs = [pool.score_async(x, p) for x, p in batches]
        for ref, (x, p) in zip(refs, batches):
            torch.testing.assert_close(ray.get(ref), local_scores(x, p))

        # an actor crashes (killed; Ray restarts it): calls still succeed
        ray.kill(pool.actors[0], no_restart=False)
        for x, p in batches[:4]:
            torch.testing.assert_close(pool(x, p), local_scores(x, p))

        # an actor gone for good: the blocking call drops it and uses the other
        ray.kill(pool.actors[1], no_restart=True)
        for x, p in batches[:4]:
            torch.testing.assert_close(pool(x, p), local_scores(x, p))
        assert pool._dead == {1}  # tried once, dropped, batch resubmitted to actor 0
    assert time.monotonic() - start < 60

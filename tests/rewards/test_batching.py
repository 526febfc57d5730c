"""rewards/batching.py: batch scoring equals scoring each request alone; failures stay with their request."""

import pytest
import torch

from digenrl.rewards.base import score_media
from digenrl.rewards.batching import score_chunked, score_requests


class Recording:
    """Mean pixel + 0.01 per prompt character; records each call's batch size; raises on 'boom'."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def _score(self, images, prompts):
        if "boom" in prompts:
            raise RuntimeError("kaboom")
        return images.mean(dim=(1, 2, 3)) + torch.tensor([0.01 * len(p) for p in prompts])

    def __call__(self, images, prompts):
        self.calls.append(images.shape[0])
        return score_media(self._score, images, prompts)


def test_batched_equals_one_by_one_and_groups_by_shape():
    requests = [
        (torch.rand(2, 3, 8, 8), ["a", "bb"]),
        (torch.rand(3, 2, 3, 8, 8), ["v", "vv", "vvv"]),  # a video request: its own group
        (torch.rand(1, 3, 8, 8), ["c"]),
        (torch.rand(2, 3, 4, 4), ["d", "e"]),  # another image size: its own group
    ]
    reward = Recording()
    results = score_requests(reward, requests, max_batch=64)
    assert sorted(reward.calls) == [2, 3, 3]  # (2 + 1) images 8x8, 3 videos, 2 images 4x4
    for (images, prompts), r in zip(requests, results):
        assert r.error is None
        torch.testing.assert_close(r.scores, Recording()(images, prompts))  # the slow reference: alone


def test_max_batch_caps_every_reward_call():
    reward = Recording()
    requests = [(torch.rand(5, 3, 4, 4), ["p"] * 5), (torch.rand(4, 3, 4, 4), ["q"] * 4)]
    results = score_requests(reward, requests, max_batch=4)
    assert reward.calls == [4, 4, 1]  # 9 samples in calls of <= 4
    torch.testing.assert_close(torch.cat([r.scores for r in results]),
                               Recording()(torch.cat([x for x, _ in requests]), ["p"] * 5 + ["q"] * 4))


def test_a_failing_request_gets_the_error_and_its_batchmates_their_scores():
    reward = Recording()
    good = torch.rand(2, 3, 4, 4)
    results = score_requests(reward, [(good, ["a", "b"]), (torch.rand(1, 3, 4, 4), ["boom"])], max_batch=8)
    assert reward.calls == [3, 2, 1]  # the batch, then each request alone
    assert results[1].scores is None and results[1].error == "reward 'recording' raised RuntimeError: kaboom"
    torch.testing.assert_close(results[0].scores, Recording()(good, ["a", "b"]))


def test_bad_reward_outputs_are_errors():
    class WrongShape(Recording):
        def __call__(self, images, prompts):
            return torch.zeros(images.shape[0] + 1)

    class NaN(Recording):
        def __call__(self, images, prompts):
            return torch.full((images.shape[0],), float("nan"))

    with pytest.raises(ValueError, match=r"returned shape \(3,\) for 2 samples"):
        score_chunked(WrongShape(), torch.rand(2, 3, 4, 4), ["a", "b"], 8)
    (r,) = score_requests(NaN(), [(torch.rand(2, 3, 4, 4), ["a", "b"])], max_batch=8)
    assert r.error == "reward 'recording' raised ValueError: returned non-finite scores"
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        score_requests(Recording(), [], max_batch=0)

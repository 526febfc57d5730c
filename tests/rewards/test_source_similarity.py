"""source-similarity: an edit reward that sees the source image, and how rewards receive sources."""

import pytest
import torch

from digenrl.rewards import AsyncRewarder, build_reward
from digenrl.rewards.source import SourceSimilarity


def test_closed_form_values():
    src = torch.full((3, 3, 4, 4), 0.5)
    images = src.clone()
    images[1] += 0.1  # every pixel 0.1 away: 1 - 0.1
    images[2, 0] = 1.0  # one channel of three 0.5 away: 1 - 0.5 / 3
    got = SourceSimilarity()(images, ["a", "b", "c"], sources=src)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.9, 1.0 - 0.5 / 3]))


def test_videos_compare_every_frame_and_sources_are_resized():
    src = torch.zeros(1, 3, 8, 8)
    video = torch.zeros(1, 4, 3, 4, 4)
    video[0, 1:] = 0.2  # frame 0 equals the source; frames 1-3 differ by 0.2: mean 0.15
    got = SourceSimilarity()(video, ["a"], sources=src)  # an 8x8 source, 4x4 frames
    torch.testing.assert_close(got, torch.tensor([1.0 - 0.15]))
    with pytest.raises(ValueError, match="sources must be"):
        SourceSimilarity()(video, ["a"], sources=torch.zeros(2, 3, 8, 8))


def test_only_rewards_that_want_sources_get_them():
    def plain(images, prompts):  # a reward of the usual protocol: two arguments only
        return images.mean(dim=(1, 2, 3))

    rewarder = AsyncRewarder({"plain": plain, "source-similarity": build_reward("source-similarity", {})},
                             {"plain": 1.0, "source-similarity": 2.0}, threads=1)
    images, src = torch.full((2, 3, 4, 4), 0.25), torch.full((2, 3, 4, 4), 0.5)
    total, parts = rewarder.submit(images, ["a", "b"], None, src).result()
    torch.testing.assert_close(parts["source-similarity"], torch.tensor([0.75, 0.75]))
    torch.testing.assert_close(total, parts["plain"] + 2.0 * parts["source-similarity"])
    with pytest.raises(ValueError, match="compares each sample with its source"):
        rewarder.score(images, ["a", "b"])
    rewarder.close()

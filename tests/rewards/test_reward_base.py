"""The reward protocol's helpers: input checks, frame selection, per-frame video scoring."""

import pytest
import torch

from digenrl.rewards.base import Reward, check_media, frame_indices, frames_to_images, score_media


def brightness(images, prompts):  # (N, 3, H, W) -> (N,): mean pixel, plus a prompt-dependent offset
    return images.mean(dim=(1, 2, 3)) + torch.tensor([0.01 * len(p) for p in prompts])


class Brightness:
    name = "brightness"

    def __call__(self, images, prompts):
        return score_media(brightness, images, prompts)


def test_protocol_is_structural():
    assert isinstance(Brightness(), Reward)
    assert not isinstance(brightness, Reward)  # no name


def test_check_media_teaches():
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\) or \(B, F, 3, H, W\)"):
        check_media(torch.rand(2, 4, 8, 8), ["a", "b"])
    with pytest.raises(ValueError, match="floating point"):
        check_media(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), ["a", "b"])
    with pytest.raises(ValueError, match="2 samples but 1 prompts"):
        check_media(torch.rand(2, 3, 8, 8), ["a"])
    with pytest.raises(TypeError, match="not a single string"):
        check_media(torch.rand(2, 3, 8, 8), "ab")


def test_frame_indices_even_and_deterministic():
    assert frame_indices(5, None).tolist() == [0, 1, 2, 3, 4]
    assert frame_indices(5, 3).tolist() == [0, 2, 4]
    assert frame_indices(9, 2).tolist() == [0, 8]
    assert frame_indices(3, 10).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="sample_frames"):
        frame_indices(4, 0)


def test_frames_to_images_layout():
    videos = torch.rand(2, 5, 3, 4, 4)
    frames, prompts, k = frames_to_images(videos, ["x", "y"], sample_frames=3)
    assert frames.shape == (6, 3, 4, 4) and k == 3
    assert prompts == ["x", "x", "x", "y", "y", "y"]
    torch.testing.assert_close(frames[4], videos[1, 2])  # video 1, second sampled frame = frame 2


def test_video_scored_per_frame_and_averaged():
    videos = torch.rand(2, 4, 3, 8, 8)
    prompts = ["ab", "abcd"]
    scores = Brightness()(videos, prompts)
    assert scores.shape == (2,) and scores.dtype == torch.float32
    expected = torch.stack([brightness(videos[b], [prompts[b]] * 4).mean() for b in range(2)])
    torch.testing.assert_close(scores, expected)
    # sampled frames: only frames 0 and 3 count
    sampled = score_media(brightness, videos, prompts, sample_frames=2)
    expected = torch.stack([brightness(videos[b, [0, 3]], [prompts[b]] * 2).mean() for b in range(2)])
    torch.testing.assert_close(sampled, expected)

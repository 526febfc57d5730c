"""The reward protocol, and the helpers that let an image reward score videos.

A reward maps generated media and their prompts to one float per sample:

    images   float32 in [0, 1], (B, 3, H, W) for images or (B, F, 3, H, W) for videos
    prompts  B strings, prompts[i] belongs to images[i]
    returns  float32 tensor (B,) on the CPU, higher is better

Every reward in DigenRL (programmatic toy rewards, CLIP-family models, a remote reward
server, a Ray worker pool) is called the same way, so rollout code never knows which
one it holds. Rewards run under `torch.no_grad`; they are not differentiated.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class Reward(Protocol):
    name: str  # stable key for metrics and advantage weights, e.g. "pickscore"

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """(B, 3, H, W) or (B, F, 3, H, W) float32 in [0, 1] + B prompts -> (B,) float32 on CPU."""
        ...


def check_media(images: torch.Tensor, prompts: Sequence[str]) -> None:
    """Raise a ValueError that says what was expected when a reward's input is malformed."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.ndim not in (4, 5) or images.shape[-3] != 3:
        raise ValueError(
            f"images must be (B, 3, H, W) or (B, F, 3, H, W) with 3 channels, got shape {tuple(images.shape)}"
        )
    if not images.is_floating_point():
        raise ValueError(f"images must be floating point in [0, 1], got dtype {images.dtype}")
    if isinstance(prompts, str):
        raise TypeError("prompts must be a sequence of strings, one per sample, not a single string")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"got {images.shape[0]} samples but {len(prompts)} prompts")


def frame_indices(num_frames: int, sample_frames: int | None) -> torch.Tensor:
    """Which frames of a video an image reward scores: all, or `sample_frames` evenly spaced.

    Evenly spaced (first and last included) rather than random, so a video's reward is a
    deterministic function of the video.
    """
    if sample_frames is None or sample_frames >= num_frames:
        return torch.arange(num_frames)
    if sample_frames < 1:
        raise ValueError(f"sample_frames must be >= 1 or None (all frames), got {sample_frames}")
    return torch.linspace(0, num_frames - 1, sample_frames).round().long()


def frames_to_images(
    videos: torch.Tensor, prompts: Sequence[str], sample_frames: int | None = None
) -> tuple[torch.Tensor, list[str], int]:
    """(B, F, 3, H, W) videos -> (B * K, 3, H, W) frames, their prompts, and K frames per video.

    Frames of one video are contiguous, so per-frame scores reshape to (B, K).
    """
    if videos.ndim != 5:
        raise ValueError(f"videos must be (B, F, 3, H, W), got shape {tuple(videos.shape)}")
    idx = frame_indices(videos.shape[1], sample_frames).to(videos.device)
    frames = videos.index_select(1, idx)  # (B, K, 3, H, W)
    k = frames.shape[1]
    frame_prompts = [p for p in prompts for _ in range(k)]
    return frames.flatten(0, 1), frame_prompts, k


def score_media(
    score_images: Callable[[torch.Tensor, Sequence[str]], torch.Tensor],
    images: torch.Tensor,
    prompts: Sequence[str],
    sample_frames: int | None = None,
) -> torch.Tensor:
    """Score images directly, or videos as the mean of their (sampled) frames' scores.

    `score_images` takes (N, 3, H, W) and N prompts and returns (N,). Returns (B,) float32 CPU.
    """
    check_media(images, prompts)
    if images.ndim == 4:
        return score_images(images, prompts).float().cpu()
    frames, frame_prompts, k = frames_to_images(images, prompts, sample_frames)
    per_frame = score_images(frames, frame_prompts).float().cpu()  # (B * K,)
    return per_frame.view(images.shape[0], k).mean(dim=1)


def to_pil_images(images: torch.Tensor) -> list:
    """(N, 3, H, W) float in [0, 1] -> N RGB PIL images, each pixel round(255 x).

    For rewards whose packages take PIL images (ImageReward, HPSv3) or encoded files (a VLM judge).
    """
    from PIL import Image

    arrays = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)  # (N, 3, H, W)
    arrays = arrays.permute(0, 2, 3, 1).cpu().numpy()  # (N, H, W, 3), what PIL reads
    return [Image.fromarray(a) for a in arrays]  # uint8 (H, W, 3) reads as RGB


def embed_each_prompt_once(embed, prompts: Sequence[str]) -> torch.Tensor:
    """embed(distinct prompts) -> (N, D), indexed back to every prompt's row: the samples of a
    GRPO group share their prompt, so each distinct one is encoded once."""
    unique = list(dict.fromkeys(prompts))
    out = embed(unique)
    return out[torch.tensor([unique.index(p) for p in prompts], device=out.device)]

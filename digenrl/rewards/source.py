"""Edit rewards that compare a sample with its source image (the reference of an edit, the
first frame of an image-to-video sample).

    SourceSimilarity()(images, prompts, sources=sources) -> (B,) in [0, 1]

An edit should change what the instruction names and keep the rest: similarity to the
source is the "keep the rest" term, to be weighted against an instruction-following reward
(e.g. reward.weights: {vlm-judge: 1.0, source-similarity: 0.3}). On its own it rewards
returning the source unchanged.
"""

from __future__ import annotations

from typing import Sequence

import torch

from digenrl.rewards.base import check_media


class SourceSimilarity:
    """1 - mean |sample - source| over pixels and channels, in [0, 1] (1: identical).

    Videos (B, F, 3, H, W): the mean over frames, every frame against the source. The source
    is resized (bilinear, antialiased) to the sample's size when they differ.
    """

    name = "source-similarity"
    wants_sources = True  # AsyncRewarder passes sources= only to rewards that set this

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str], *, sources: torch.Tensor) -> torch.Tensor:
        check_media(images, prompts)
        if sources.ndim != 4 or sources.shape[1] != 3 or sources.shape[0] != images.shape[0]:
            raise ValueError(f"sources must be (B={images.shape[0]}, 3, H, W), got {tuple(sources.shape)}")
        x = images.float().cpu()
        src = sources.float().cpu()
        if src.shape[-2:] != x.shape[-2:]:
            src = torch.nn.functional.interpolate(src, size=x.shape[-2:], mode="bilinear", antialias=True,
                                                  align_corners=False)
        if x.ndim == 5:  # (B, F, 3, H, W): each frame against the source
            src = src[:, None]
        diff = (x - src).abs()
        return 1.0 - diff.flatten(1).mean(dim=1)  # (B,)

"""Scoring many requests with one reward: what the reward server does with each batch that
Ray Serve's `@serve.batch` hands it (`digenrl.runtime.serving.reward_app`). No Ray here: plain
functions of a reward and tensors, tested on their own.

    requests [(images (B_i, ...), prompts_i)]
        --group by sample shape--> reward calls of <= max_batch samples each
        --> one result per request: (B_i,) scores, or the message of the failure it caused

Requests whose images share a shape are concatenated and scored together (a larger group is
scored in max_batch chunks). A reward call that raises is re-run request by request, so only
the request that made it fail gets the error; its batchmates still get their scores.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from digenrl.rewards.base import Reward

log = logging.getLogger(__name__)


@dataclass
class Scored:
    """One request's outcome: `scores` (B,) float32, or `error` (the reward's failure, for a 500)."""

    scores: torch.Tensor | None = None
    error: str | None = None


@torch.no_grad()
def score_chunked(reward: Reward, images: torch.Tensor, prompts: list[str], max_batch: int) -> torch.Tensor:
    """(B, ...) images -> (B,) float32 scores, in reward calls of at most max_batch samples.

    Raises ValueError when the reward returns the wrong shape or non-finite scores.
    """
    outs = []
    for i in range(0, images.shape[0], max_batch):
        chunk = images[i : i + max_batch]
        out = torch.as_tensor(reward(chunk, prompts[i : i + max_batch])).float().cpu()
        if out.shape != (chunk.shape[0],):
            raise ValueError(f"returned shape {tuple(out.shape)} for {chunk.shape[0]} samples")
        outs.append(out)
    scores = torch.cat(outs)
    if not torch.isfinite(scores).all():
        raise ValueError("returned non-finite scores")
    return scores


def score_requests(
    reward: Reward, requests: Sequence[tuple[torch.Tensor, list[str]]], max_batch: int
) -> list[Scored]:
    """Score each (images, prompts) request; same-shaped requests share reward calls.

    Returns one `Scored` per request, in order. Never raises for a reward's failure.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    results: list[Scored | None] = [None] * len(requests)
    groups: dict[tuple[int, ...], list[int]] = {}  # sample shape (C, H, W) or (F, C, H, W) -> request indices
    for i, (images, _) in enumerate(requests):
        groups.setdefault(tuple(images.shape[1:]), []).append(i)
    for indices in groups.values():
        _score_group(reward, requests, indices, max_batch, results)
    return results  # type: ignore[return-value] - every index belongs to one group


def _score_group(reward, requests, indices: list[int], max_batch: int, results: list) -> None:
    images = torch.cat([requests[i][0] for i in indices])
    prompts = [p for i in indices for p in requests[i][1]]
    try:
        scores = score_chunked(reward, images, prompts, max_batch)
    except Exception as e:  # noqa: BLE001 - the reward's failure goes back to its request, not up
        if len(indices) > 1:  # find out which request it was: score them one by one
            for i in indices:
                _score_group(reward, requests, [i], max_batch, results)
            return
        log.exception("reward failed")
        results[indices[0]] = Scored(error=f"reward {reward.name!r} raised {type(e).__name__}: {e}")
        return
    start = 0
    for i in indices:
        n = requests[i][0].shape[0]
        results[i] = Scored(scores=scores[start : start + n])
        start += n

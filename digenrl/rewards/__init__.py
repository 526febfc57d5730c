"""Rewards: (images, prompts) -> Tensor[B]; edit rewards also see the source (SOURCE_REWARDS),
audio rewards the generated audio track (AUDIO_REWARDS).

Builders are looked up by name; model-based rewards load lazily from `reward.paths`
(local folders; nothing is downloaded). `AsyncRewarder` scores micro-batches in a thread
pool so rewards overlap the generation of the next micro-batch.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from digenrl.models.families import names  # an audio reward needs a family with audio

REWARD_NAMES = (
    "toy-geneval",
    "jpeg-compressibility",
    "jpeg-incompressibility",
    "pickscore",
    "clip-score",
    "aesthetic",
    "hpsv2",
    "ocr",
    "hpsv3",
    "imagereward",
    "geneval-detector",
    "remote",
    "vlm-judge",
    "source-similarity",
    "clap",
    "xclip",
)

# computed by program, on CPU: no reward.paths entry, no model to load
BUILTIN_REWARDS = ("toy-geneval", "jpeg-compressibility", "jpeg-incompressibility", "source-similarity")
# rewards that also compare each sample with its source image (edit / image-to-video runs):
# their classes set `wants_sources = True` and are called with sources=(B, 3, H, W)
SOURCE_REWARDS = ("source-similarity",)
# rewards that score the generated audio: their classes set `wants_audio = True` and are called
# with audio=(B, channels, samples) in [-1, 1] and audio_rate=<Hz>
AUDIO_REWARDS = ("clap",)
# rewards that score videos only (model.name must be a video family: digenrl.models.families)
VIDEO_REWARDS = ("xclip",)

if TYPE_CHECKING:  # the names above are read by the configuration and the simulator: no torch for them
    import torch

RewardFn = Callable[["torch.Tensor", list[str]], "torch.Tensor"]


def build_reward(name: str, paths: Mapping[str, str], device: str = "cpu") -> RewardFn:
    """A reward by name; model rewards need `paths[name]` (a local folder; for remote and vlm-judge, a server)."""
    if name not in REWARD_NAMES:
        raise ValueError(f"reward {name!r} unknown; choose one of: {', '.join(REWARD_NAMES)}")
    from digenrl.rewards import toy

    if name == "toy-geneval":
        return toy.ToyGenEval()
    if name == "jpeg-compressibility":
        return toy.JpegCompressibility()
    if name == "jpeg-incompressibility":
        return toy.JpegIncompressibility()
    if name == "source-similarity":
        from digenrl.rewards.source import SourceSimilarity

        return SourceSimilarity()
    if name not in paths:
        raise ValueError(f"reward {name!r} needs reward.paths.{name}=<local model folder or URL>")
    from digenrl.rewards import registry_models  # model rewards: transformers, optional extras

    return registry_models.build(name, paths[name], device)


class AsyncRewarder:
    """Scores micro-batches in background threads; combines several rewards into one."""

    def __init__(
        self,
        rewards: Mapping[str, RewardFn],
        weights: Mapping[str, float],
        *,
        aggregate: str = "sum",
        threads: int = 2,
    ):
        self.rewards = dict(rewards)
        self.weights = dict(weights)
        self.aggregate = aggregate
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reward")

    def score(self, images: torch.Tensor, prompts: list[str], group_ids: Optional[torch.Tensor] = None,
              sources: Optional[torch.Tensor] = None, aggregate: Optional[str] = None, *,
              audio: Optional[torch.Tensor] = None, audio_rate: Optional[int] = None):
        """(combined (B,), {name: (B,)} incl. sub-scores a reward reports) — synchronous.

        sources: the conditioning images (B, 3, H, W) of an edit / image-to-video run; only
        rewards that declare `wants_sources` receive them. audio: the generated audio
        (B, channels, samples) in [-1, 1] at audio_rate Hz; only rewards that declare
        `wants_audio` receive them. aggregate: overrides the rewarder's (held-out evaluation
        scores with "sum": a group-standardised score averages to 0).
        """
        parts: dict[str, torch.Tensor] = {}
        details: dict[str, torch.Tensor] = {}
        for name, fn in self.rewards.items():
            extra = {}
            if getattr(fn, "wants_sources", False):
                if sources is None:
                    raise ValueError(f"reward {name!r} compares each sample with its source image, "
                                     f"but this run has none (a conditioned model family has)")
                extra["sources"] = sources
            if getattr(fn, "wants_audio", False):
                if audio is None or audio_rate is None:
                    raise ValueError(f"reward {name!r} scores the generated audio, but this run passed "
                                     f"{'no audio' if audio is None else 'no audio_rate'} "
                                     f"(families with audio: {', '.join(names(audio=True))})")
                extra.update(audio=audio, audio_rate=audio_rate)
            if extra:
                parts[name] = fn(images, prompts, **extra).float().cpu()
            elif hasattr(fn, "score"):  # rewards that report sub-criteria (toy-geneval)
                out = fn.score(images, prompts)
                parts[name] = out["reward"].float().cpu()
                details.update({f"{name}/{k}": v for k, v in out.items() if k != "reward"})
            else:
                parts[name] = fn(images, prompts).float().cpu()
        from digenrl.math.advantages import combine_rewards

        total = combine_rewards(parts, self.weights, aggregate=aggregate or self.aggregate, group_ids=group_ids)
        return total, {**parts, **details}

    def submit(self, images: torch.Tensor, prompts: list[str], group_ids: Optional[torch.Tensor] = None,
               sources: Optional[torch.Tensor] = None, *, audio: Optional[torch.Tensor] = None,
               audio_rate: Optional[int] = None) -> Future:
        return self.pool.submit(self.score, images, prompts, group_ids, sources, audio=audio, audio_rate=audio_rate)

    def close(self) -> None:
        self.pool.shutdown(wait=True)

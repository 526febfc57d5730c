"""Human-preference rewards whose models live in optional packages:

    HPSv3Score(checkpoint_path)        HPSv3 (Ma et al. 2025), a Qwen2-VL-7B preference model;
                                       pip install 'digenrl[hpsv3]'
    ImageRewardScore(checkpoint_path)  ImageReward (Xu et al. 2023), BLIP + MLP head;
                                       pip install 'digenrl[imagereward]'

Both packages take PIL images, so the float batch is rounded to uint8 (round(255 x)) first.
Each package is imported when its reward is constructed; without it the ImportError names
the extra to install. Videos are scored per frame and averaged (`sample_frames`).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from digenrl.rewards.base import score_media, to_pil_images


def _check_common(checkpoint_path: str, sample_frames: int | None) -> None:
    if not checkpoint_path:
        raise ValueError("checkpoint_path is required: the reward model's weights file")
    if sample_frames is not None and (not isinstance(sample_frames, int) or sample_frames < 1):
        raise ValueError(f"sample_frames: must be an integer >= 1, or None for all frames; got {sample_frames!r}")


class HPSv3Score:
    """HPSv3: the preference score mu of a Qwen2-VL reward model (higher is better).

    `checkpoint_path` is the released `HPSv3.safetensors`; `config_path` the package's model
    config (None: its HPSv3_7B.yaml, which names the base model `Qwen/Qwen2-VL-7B-Instruct`,
    loaded by transformers from a local folder or the Hugging Face cache). The model answers
    (mu, sigma) per image; the reward is mu, as the HPSv3 authors use it.
    """

    name = "hpsv3"

    def __init__(
        self,
        checkpoint_path: str,
        *,
        config_path: str | None = None,
        device: str | torch.device = "cpu",
        batch_size: int = 8,
        sample_frames: int | None = None,
    ):
        _check_common(checkpoint_path, sample_frames)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
        try:
            from hpsv3 import HPSv3RewardInferencer
        except ImportError as e:
            raise ImportError("the HPSv3 reward needs the `hpsv3` package: pip install 'digenrl[hpsv3]'") from e
        self.inferencer = HPSv3RewardInferencer(
            config_path=config_path, checkpoint_path=checkpoint_path, device=str(device)
        )
        self.batch_size, self.sample_frames = batch_size, sample_frames

    def _score_images(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        out = []
        for i in range(0, images.shape[0], self.batch_size):
            pils = to_pil_images(images[i : i + self.batch_size])
            logits = self.inferencer.reward(pils, list(prompts[i : i + self.batch_size]))  # (n, 2): mu, sigma
            out.append(torch.as_tensor(logits)[:, 0].float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return score_media(self._score_images, images, prompts, self.sample_frames)


class ImageRewardScore:
    """ImageReward: a preference score, standardised by the package's own mean and std (higher is better).

    `checkpoint_path` is the released `ImageReward.pt`; `med_config_path` its BLIP text-encoder
    config `med_config.json` (default: the one next to the checkpoint). Both are required on
    disk because `ImageReward.load` would otherwise download the config. The package's BLIP
    tokenizer is `bert-base-uncased`, read by transformers from the Hugging Face cache.
    """

    name = "imagereward"

    def __init__(
        self,
        checkpoint_path: str,
        *,
        med_config_path: str | None = None,
        device: str | torch.device = "cpu",
        sample_frames: int | None = None,
    ):
        _check_common(checkpoint_path, sample_frames)
        if med_config_path is None:
            med_config_path = os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), "med_config.json")
            if not os.path.isfile(med_config_path):
                raise ValueError(
                    f"med_config_path: not given and no med_config.json next to {checkpoint_path}; "
                    "pass med_config_path=<path to ImageReward's med_config.json> (nothing is downloaded)"
                )
        try:
            import ImageReward as RM
        except ImportError as e:
            raise ImportError(
                "the ImageReward reward needs the `image-reward` package: pip install 'digenrl[imagereward]'"
            ) from e
        self.model = RM.load(checkpoint_path, device=str(device), med_config=med_config_path)
        self.sample_frames = sample_frames

    def _score_images(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        pils = to_pil_images(images)
        scores = torch.empty(len(pils), dtype=torch.float32)
        # model.score(prompt, [images]) scores several images against ONE prompt: one call per
        # distinct prompt (a GRPO group shares one), results put back at the samples' positions
        for prompt in dict.fromkeys(prompts):
            idx = [i for i, p in enumerate(prompts) if p == prompt]
            out = self.model.score(prompt, [pils[i] for i in idx])
            out = [out] if isinstance(out, (int, float)) else list(out)  # one image: a float (its squeeze)
            if len(out) != len(idx):
                raise RuntimeError(f"ImageReward returned {len(out)} scores for {len(idx)} images")
            scores[idx] = torch.tensor(out, dtype=torch.float32)
        return scores

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return score_media(self._score_images, images, prompts, self.sample_frames)

"""Video-text reward: X-CLIP (Ni et al. 2022, arXiv 2208.02816) through transformers' XCLIPModel.

    XClipScore(path)(videos (B, F, 3, H, W) in [0, 1], prompts) -> (B,) in [-1, 1]

`path` is a local folder holding an XCLIPModel (config.json + weights), its image processor
(preprocessor_config.json) and its CLIP tokenizer, as `microsoft/xclip-base-patch32`
downloads. Nothing is downloaded.

A video model, not frames averaged: `config.vision_config.num_frames` frames (8 for the
released base models), evenly spaced with first and last included (`base.frame_indices`;
a shorter video repeats frames), each pass CLIP's vision tower; the cross-frame
"multi-frame integration transformer" pools them into one video embedding, and the prompt
generator adds to the prompt's text embedding a term attending to that video's patch
tokens (X-CLIP's video-specific prompting). The reward is X-CLIP's own similarity, the
diagonal of XCLIPModel.forward's `logits_per_video` divided by `logit_scale.exp()`
(transformers@v5.25.0 src/transformers/models/x_clip/modeling_x_clip.py:1077-1122): the
cosine of the video embedding and the video-conditioned prompt embedding. Cosine rather than logits: a scale
the checkpoint learned for a softmax over many captions says nothing about one caption's
fit, and a cosine is on clip-score's scale; `get_text_features` alone would skip the
prompt generator and so not be X-CLIP's similarity. Computed per (video, its own prompt)
pair from the model's modules, so the cost is linear in the batch, not the forward's
B x B pairs. Frames are preprocessed in torch like the CLIP rewards (`ClipPreprocess`:
resize the short side, center-crop, normalise by the folder's preprocessor_config.json).
Images (B, 3, H, W) are refused: this is a video reward.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from digenrl.rewards.base import check_media, embed_each_prompt_once, frame_indices
from digenrl.rewards.clip_models import ClipPreprocess


def video_frame_indices(num_frames: int, model_frames: int) -> torch.Tensor:
    """`model_frames` indices into a video of `num_frames`: evenly spaced, first and last
    included; a shorter video repeats frames (the model's frame position table is fixed)."""
    if num_frames >= model_frames:
        return frame_indices(num_frames, model_frames)
    return torch.linspace(0, num_frames - 1, model_frames).round().long()


class XClipScore:
    """X-CLIP video-text similarity: cos(video embedding, video-conditioned prompt embedding), in [-1, 1]."""

    name = "xclip"

    def __init__(
        self,
        path: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        batch_size: int = 8,
        local_files_only: bool = True,
    ):
        from transformers import AutoTokenizer, XCLIPModel

        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        self.device, self.dtype = torch.device(device), dtype
        model = XCLIPModel.from_pretrained(path, local_files_only=local_files_only)
        self.model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        self.preprocess = ClipPreprocess.from_pretrained(path, local_files_only)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_files_only)
        self.max_length = min(self.tokenizer.model_max_length, self.model.config.text_config.max_position_embeddings)
        self.num_frames = int(self.model.config.vision_config.num_frames)
        self.batch_size = batch_size

    def pixel_values(self, videos: torch.Tensor) -> torch.Tensor:
        """(B, F, 3, H, W) in [0, 1] -> (B, num_frames, 3, h, w): the sampled frames, preprocessed."""
        idx = video_frame_indices(videos.shape[1], self.num_frames).to(videos.device)
        frames = videos.index_select(1, idx)
        b, k = frames.shape[:2]
        x = self.preprocess(frames.flatten(0, 1).to(self.device))  # (B * K, 3, h, w)
        return x.view(b, k, *x.shape[1:])

    @torch.no_grad()
    def text_embeds(self, prompts: Sequence[str]) -> torch.Tensor:
        """N prompts -> (N, D) projected text embeddings, before the prompt generator.
        Padding to max_length keeps them batch-invariant."""
        tok = self.tokenizer(list(prompts), padding="max_length", truncation=True, max_length=self.max_length,
                             return_tensors="pt").to(self.device)
        pooled = self.model.text_model(input_ids=tok.input_ids, attention_mask=tok.attention_mask).pooler_output
        return self.model.text_projection(pooled)

    @torch.no_grad()
    def video_text_cosine(self, pixels: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """(B, K, 3, h, w) pixels and (B, D) text embeddings -> (B,) X-CLIP cosine of each pair.

        XCLIPModel.forward's steps for the matching pairs only: vision tower per frame,
        projection, MIT pooling; patch tokens -> layernorm -> projection, mean over frames;
        text + prompt generator(text, patch features)."""
        m = self.model
        b, k = pixels.shape[:2]
        vision = m.vision_model(pixel_values=pixels.flatten(0, 1).to(self.dtype))
        cls = m.visual_projection(vision.pooler_output).view(b, k, -1)
        video = m.mit(cls).pooler_output  # (B, D)
        patches = m.prompts_visual_layernorm(vision.last_hidden_state[:, 1:, :]) @ m.prompts_visual_projection
        patches = patches.view(b, k, -1, video.shape[-1]).mean(dim=1)  # (B, P, D)
        text = text[:, None, :]  # (B, 1, D): one query per video, its own prompt
        text = (text + m.prompts_generator(text, patches))[:, 0]
        return (F.normalize(video.float(), dim=-1) * F.normalize(text.float(), dim=-1)).sum(dim=-1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_media(images, prompts)
        if images.ndim != 5:
            raise ValueError(f"xclip scores videos (B, F, 3, H, W); got images of shape {tuple(images.shape)}: "
                             "use an image reward (clip-score, pickscore) for an image model")
        text = embed_each_prompt_once(self.text_embeds, prompts)  # (B, D)
        scores = []
        for i in range(0, images.shape[0], self.batch_size):
            pixels = self.pixel_values(images[i : i + self.batch_size])
            scores.append(self.video_text_cosine(pixels, text[i : i + self.batch_size]).float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0)

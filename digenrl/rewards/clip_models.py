"""Learned reward models: CLIP score, PickScore, LAION aesthetic, HPSv2, OCR.

All of them implement `digenrl.rewards.base.Reward`. Weights come from a local directory
(or the Hugging Face cache; pass `local_files_only=False` to allow downloads):

    ClipScore(path)                        cos(img, text) of a transformers CLIPModel
    PickScore(path, processor_path=...)    logit_scale * cos(img, text)  (yuvalkirstain/PickScore_v1,
                                           processor from laion/CLIP-ViT-H-14-laion2B-s32B-b79K)
    AestheticScore(clip_path, head_path)   MLP(normalised CLIP image embedding), LAION predictor v2
    HPSv2Score(checkpoint_path)            needs `pip install digenrl[hpsv2]`
    OCRScore()                             needs `pip install digenrl[ocr]`

Preprocessing is the CLIP image processor's recipe done in torch on the batch (resize the
shortest edge, center-crop, normalise with the processor's mean/std), so generated images
never round-trip through PIL or uint8. Scoring is batched (`batch_size`), under no_grad,
on `device`; scores come back float32 on the CPU. Videos are scored per frame and averaged
(`sample_frames` evenly spaced frames, or all).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from digenrl.rewards.base import embed_each_prompt_once, score_media

# OpenAI CLIP normalisation; open_clip ViT-H-14 (HPSv2) uses the same numbers.
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_PIL_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL enum in preprocessor_config.json


def _resolve_file(path: str, filename: str, local_files_only: bool = True) -> str:
    """`path/filename` for a local directory, else the file from the Hugging Face cache."""
    if os.path.isdir(path):
        full = os.path.join(path, filename)
        if not os.path.isfile(full):
            raise FileNotFoundError(f"{filename} not found in {path}")
        return full
    from transformers.utils import cached_file

    return cached_file(path, filename, local_files_only=local_files_only)


# ---------------------------------------------------------------------------------------
# Preprocessing in torch
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClipPreprocess:
    """CLIP image preprocessing on float tensors in [0, 1]: (N, 3, H, W) -> (N, 3, crop_h, crop_w).

    `shortest_edge` resizes keeping the aspect ratio (CLIP's recipe); `size` resizes to an
    exact (h, w) instead. Bicubic with antialias, like PIL, then clamped back to [0, 1].
    """

    crop: tuple[int, int]
    mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    std: tuple[float, ...] = OPENAI_CLIP_STD
    shortest_edge: int | None = None
    size: tuple[int, int] | None = None
    mode: str = "bicubic"

    @classmethod
    def from_pretrained(cls, path: str, local_files_only: bool = True) -> "ClipPreprocess":
        """Read a transformers `preprocessor_config.json` (CLIPImageProcessor fields)."""
        with open(_resolve_file(path, "preprocessor_config.json", local_files_only)) as f:
            cfg = json.load(f)
        size, crop = cfg.get("size", 224), cfg.get("crop_size", cfg.get("size", 224))
        shortest_edge, exact = None, None
        if cfg.get("do_resize", True):
            if isinstance(size, int):
                shortest_edge = size
            elif "shortest_edge" in size:
                shortest_edge = size["shortest_edge"]
            else:
                exact = (size["height"], size["width"])
        crop_hw = (crop, crop) if isinstance(crop, int) else (crop["height"], crop["width"])
        if not cfg.get("do_center_crop", True):
            crop_hw = exact or crop_hw
        mean = tuple(cfg.get("image_mean", OPENAI_CLIP_MEAN)) if cfg.get("do_normalize", True) else (0.0,) * 3
        std = tuple(cfg.get("image_std", OPENAI_CLIP_STD)) if cfg.get("do_normalize", True) else (1.0,) * 3
        mode = _PIL_RESAMPLE.get(cfg.get("resample", 3), "bicubic")
        return cls(crop=crop_hw, mean=mean, std=std, shortest_edge=shortest_edge, size=exact, mode=mode)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        h, w = images.shape[-2:]
        if self.size is not None:
            out_hw = self.size
        elif self.shortest_edge is not None:
            # transformers' get_resize_output_image_size: short side -> edge, long side scaled, floored
            s = self.shortest_edge
            out_hw = (s, int(s * w / h)) if h <= w else (int(s * h / w), s)
        else:
            out_hw = (h, w)
        # never smaller than the crop (transformers would zero-pad; upsampling is kinder)
        out_hw = (max(out_hw[0], self.crop[0]), max(out_hw[1], self.crop[1]))
        x = images.float()
        if out_hw != (h, w):
            smooth = self.mode in ("bilinear", "bicubic")
            x = F.interpolate(x, size=out_hw, mode=self.mode, antialias=smooth, align_corners=False if smooth else None)
            x = x.clamp(0.0, 1.0)  # bicubic overshoot; PIL clips to the uint8 range
        top, left = (out_hw[0] - self.crop[0]) // 2, (out_hw[1] - self.crop[1]) // 2
        x = x[..., top : top + self.crop[0], left : left + self.crop[1]]
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std


# ---------------------------------------------------------------------------------------
# transformers CLIP backbone shared by CLIP score, PickScore and the aesthetic predictor
# ---------------------------------------------------------------------------------------


class ClipBackbone:
    """A frozen transformers CLIPModel + tokenizer + torch preprocessing, on one device."""

    def __init__(
        self,
        path: str,
        processor_path: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        local_files_only: bool = True,
        load_text: bool = True,
    ):
        from transformers import AutoTokenizer, CLIPModel

        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # "bfloat16" from a CLI spec
        self.device, self.dtype = torch.device(device), dtype
        model = CLIPModel.from_pretrained(path, local_files_only=local_files_only)
        self.model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        processor_path = processor_path or path
        self.preprocess = ClipPreprocess.from_pretrained(processor_path, local_files_only)
        self.tokenizer = None
        if load_text:
            self.tokenizer = AutoTokenizer.from_pretrained(processor_path, local_files_only=local_files_only)
            # tokenizers often report a huge model_max_length; the position table is the real cap
            self.max_length = min(
                self.tokenizer.model_max_length, self.model.config.text_config.max_position_embeddings
            )

    @torch.no_grad()
    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) in [0, 1] -> (N, D) unit-norm float32."""
        pixels = self.preprocess(images.to(self.device)).to(self.dtype)
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return F.normalize(self.model.visual_projection(pooled).float(), dim=-1)

    @torch.no_grad()
    def text_embeds(self, prompts: Sequence[str]) -> torch.Tensor:
        """N prompts -> (N, D) unit-norm float32. Padding to max_length keeps it batch-invariant."""
        tok = self.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        pooled = self.model.text_model(input_ids=tok.input_ids, attention_mask=tok.attention_mask).pooler_output
        return F.normalize(self.model.text_projection(pooled).float(), dim=-1)

    def image_text_cosine(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        """(N,) cos(image_i, prompt_i). Each distinct prompt is encoded once (groups share prompts)."""
        text = embed_each_prompt_once(self.text_embeds, prompts)  # (N, D)
        return (self.image_embeds(images) * text).sum(dim=-1)


def _chunked(fn, images: torch.Tensor, prompts: Sequence[str], batch_size: int) -> torch.Tensor:
    """fn over chunks of at most batch_size samples, concatenated: (N,) float32 CPU."""
    outs = [
        fn(images[i : i + batch_size], prompts[i : i + batch_size]).float().cpu()
        for i in range(0, images.shape[0], batch_size)
    ]
    return torch.cat(outs) if outs else torch.zeros(0)


class ClipScore:
    """CLIP score: cosine similarity of image and prompt embeddings, in [-1, 1]."""

    name = "clip-score"

    def __init__(
        self,
        path: str,
        *,
        processor_path: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        batch_size: int = 32,
        sample_frames: int | None = None,
        local_files_only: bool = True,
    ):
        self.clip = ClipBackbone(path, processor_path, device, dtype, local_files_only)
        self.batch_size, self.sample_frames = batch_size, sample_frames

    def _score_images(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return _chunked(self.clip.image_text_cosine, images, prompts, self.batch_size)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return score_media(self._score_images, images, prompts, self.sample_frames)


class PickScore(ClipScore):
    """PickScore (Kirstain et al. 2023): logit_scale.exp() * cos(image, prompt), ~[15, 25] in practice.

    As on the PickScore_v1 model card. Flow-GRPO trains on score / 26; scale with a reward
    weight rather than here, so the logged number stays the one the paper reports.
    """

    name = "pickscore"

    def _score_images(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        scale = self.clip.model.logit_scale.exp().float().cpu()
        return scale * super()._score_images(images, prompts)


def load_aesthetic_head(path: str) -> torch.nn.Sequential:
    """Linear layers from a safetensors file, applied in order with no activation in between.

    Matches the LAION aesthetic predictor v2 MLP (`layers.{0,2,4,6,7}.{weight,bias}`:
    768 -> 1024 -> 128 -> 64 -> 16 -> 1; its Dropouts are identity in eval, and it has no
    nonlinearity) and the v1 linear head (`weight`, `bias`). Convert the released .pth once:
    `save_file(torch.load(pth, weights_only=True), "aesthetic_head.safetensors")`.
    """
    from safetensors.torch import load_file

    state = load_file(path)
    weights = [k for k, v in state.items() if k.endswith("weight") and v.ndim == 2]
    if not weights:
        raise ValueError(f"{path}: no 2-D '*weight' tensors; expected LAION aesthetic head keys like layers.0.weight")

    def order(key: str) -> list[int]:
        return [int(n) for n in re.findall(r"\d+", key)]

    layers = []
    for key in sorted(weights, key=order):
        w = state[key]
        bias = state.get(key[: -len("weight")] + "bias")
        if layers and layers[-1].out_features != w.shape[1]:
            raise ValueError(
                f"{path}: {key} expects {w.shape[1]} inputs but the previous layer gives {layers[-1].out_features}"
            )
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
        with torch.no_grad():
            lin.weight.copy_(w)
            if bias is not None:
                lin.bias.copy_(bias)
        layers.append(lin)
    if layers[-1].out_features != 1:
        raise ValueError(f"{path}: the last layer must output 1 score, it outputs {layers[-1].out_features}")
    return torch.nn.Sequential(*layers).eval().requires_grad_(False)


class AestheticScore:
    """LAION aesthetic predictor: MLP head on the unit-norm CLIP image embedding (~1-10). Prompts unused.

    The released v2 head expects CLIP ViT-L/14 (openai/clip-vit-large-patch14) embeddings.
    """

    name = "aesthetic"

    def __init__(
        self,
        clip_path: str,
        head_path: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        batch_size: int = 32,
        sample_frames: int | None = None,
        local_files_only: bool = True,
    ):
        self.clip = ClipBackbone(clip_path, None, device, dtype, local_files_only, load_text=False)
        self.head = load_aesthetic_head(head_path).to(self.clip.device)  # float32: small, keep exact
        dim = self.clip.model.config.projection_dim
        if self.head[0].in_features != dim:
            raise ValueError(
                f"aesthetic head takes {self.head[0].in_features}-d embeddings but {clip_path} gives {dim}-d"
            )
        self.batch_size, self.sample_frames = batch_size, sample_frames

    def _score_chunk(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.head(self.clip.image_embeds(images)).squeeze(-1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        fn = lambda x, p: _chunked(self._score_chunk, x, p, self.batch_size)  # noqa: E731
        return score_media(fn, images, prompts, self.sample_frames)


# ---------------------------------------------------------------------------------------
# Rewards whose models live in optional packages
# ---------------------------------------------------------------------------------------


class HPSv2Score:
    """HPS v2 / v2.1 (Wu et al. 2023): open_clip ViT-H-14 fine-tuned on human preferences.

    `checkpoint_path` is the released `HPS_v2.1_compressed.pt` (or v2), loaded with
    `weights_only=True`. Score = cos(image, prompt) of the fine-tuned model (~0.2-0.35).
    """

    name = "hpsv2"

    def __init__(
        self,
        checkpoint_path: str,
        *,
        device: str | torch.device = "cpu",
        batch_size: int = 32,
        sample_frames: int | None = None,
    ):
        try:
            from hpsv2.src.open_clip import create_model_and_transforms, get_tokenizer
        except ImportError as e:
            raise ImportError(
                "the HPSv2 reward needs the `hpsv2` package: pip install digenrl[hpsv2]"
            ) from e
        self.device = torch.device(device)
        model, _, _ = create_model_and_transforms(
            "ViT-H-14", pretrained=None, precision="fp32", device=self.device, jit=False,
            force_quick_gelu=False, force_custom_text=False, force_patch_dropout=False,
            force_image_size=None, pretrained_image=False, image_mean=None, image_std=None,
            light_augmentation=True, aug_cfg={}, output_dict=True,
            with_score_predictor=False, with_region_predictor=False,
        )  # fmt: skip
        ckpt = torch.load(checkpoint_path, map_location=self.device, weights_only=True)
        model.load_state_dict(ckpt.get("state_dict", ckpt))
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = get_tokenizer("ViT-H-14")
        self.preprocess = ClipPreprocess(crop=(224, 224), shortest_edge=224)
        self.batch_size, self.sample_frames = batch_size, sample_frames

    def _score_chunk(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        pixels = self.preprocess(images.to(self.device))
        text = self.tokenizer(list(prompts)).to(self.device)
        out = self.model(pixels, text)
        return (out["image_features"] * out["text_features"]).sum(dim=-1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        fn = lambda x, p: _chunked(self._score_chunk, x, p, self.batch_size)  # noqa: E731
        return score_media(fn, images, prompts, self.sample_frames)


def levenshtein(a: str, b: str) -> int:
    """Edit distance, O(len(a) * len(b)) with one row of memory."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def ocr_target(prompt: str) -> str:
    """The text an image should render: the first "quoted" span of the prompt, else the prompt."""
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 else prompt


def ocr_similarity(recognized: str, target: str) -> float:
    """Flow-GRPO's OCR reward: 1 - min(edit distance, len) / len, ignoring case and spaces."""
    recognized, target = recognized.replace(" ", "").lower(), target.replace(" ", "").lower()
    if not target:
        return 0.0
    return 1.0 - min(levenshtein(recognized, target), len(target)) / len(target)


class OCRScore:
    """Text rendering accuracy (Flow-GRPO OCR reward) with PaddleOCR 2.x. Range [0, 1]."""

    name = "ocr"

    def __init__(self, *, lang: str = "en", use_gpu: bool = False, sample_frames: int | None = None):
        try:
            from paddleocr import PaddleOCR
        except ImportError as e:
            raise ImportError(
                "the OCR reward needs `paddleocr` (2.x) and `paddlepaddle`: pip install digenrl[ocr]"
            ) from e
        self.ocr = PaddleOCR(use_angle_cls=False, lang=lang, use_gpu=use_gpu, show_log=False)
        self.sample_frames = sample_frames

    def _score_images(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        # PaddleOCR takes HWC uint8 arrays; (N, 3, H, W) -> (N, H, W, 3)
        arrays = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        scores = []
        for array, prompt in zip(arrays, prompts):
            lines = self.ocr.ocr(array, cls=False)[0] or []
            recognized = "".join(text for _box, (text, conf) in lines if conf > 0)
            scores.append(ocr_similarity(recognized, ocr_target(prompt)))
        return torch.tensor(scores, dtype=torch.float32)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return score_media(self._score_images, images, prompts, self.sample_frames)

"""A GenEval-style reward on an open-vocabulary detector (OWLv2, transformers).

    GenEvalDetector(path, metadata=None, clip_path=None, ...)   reward name "geneval-detector"

Per image: look up the prompt's GenEval metadata (a jsonl given as `metadata=`, else a
toy-world prompt converted by `geneval.toy_metadata`), ask the detector for the classes
it names, keep detections scoring >= `threshold` (`counting_threshold` for prompts tagged
"counting", GenEval's 0.3 / 0.9), classify each kept detection's colour, and score the
metadata's clauses (`digenrl.rewards.geneval`). `score()` returns the partial-credit
reward, GenEval's strict 0/1 and the per-kind fractions.

OWLv2 scores each (patch, query) pair with its own sigmoid, so asking only for the
prompt's classes gives the same scores per class as asking for a fixed vocabulary.
Colour: CLIP zero-shot on the box crop ("a photo of a {color} {class}") when `clip_path`
is given, else the nearest named colour to the crop's mean foreground pixel (pixels that
differ from the image border's median colour; a stand-in for GenEval's segmentation
masks that suits flat-coloured objects, not photographs).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

import torch
import torch.nn.functional as F

from digenrl.rewards import geneval
from digenrl.rewards.clip_models import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, _resolve_file
from digenrl.rewards.geneval import GENEVAL_COLORS, Detection
from digenrl.toy.world import ToyPrompt


class Detector(Protocol):
    def detect(self, images: torch.Tensor, queries: list[list[str]]) -> list[list[Detection]]:
        """(N, 3, H, W) in [0, 1] + per image its text queries -> per image its detections, best first."""
        ...


# ---------------------------------------------------------------------------------------
# Boxes
# ---------------------------------------------------------------------------------------


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, 4) x (M, 4) xyxy -> (N, M) intersection over union."""
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-12)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression: indices kept, highest score first.

    A box is dropped when its IoU with a kept, higher-scoring box exceeds `iou_threshold`
    (1.0 keeps everything, as GenEval's setting does). O(K^2) on K boxes: K is the
    handful above a score threshold.
    """
    order = scores.argsort(descending=True)
    iou = box_iou(boxes[order], boxes[order])  # (K, K)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(int(order[i]))
        suppressed |= iou[i] > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def cxcywh_to_xyxy(b: torch.Tensor) -> torch.Tensor:
    cxcy, wh = b[..., :2], b[..., 2:]
    return torch.cat([cxcy - wh / 2, cxcy + wh / 2], dim=-1)


# ---------------------------------------------------------------------------------------
# OWLv2 backend
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwlPreprocess:
    """OWLv2's image preprocessing in torch: (N, 3, H, W) in [0, 1] -> (N, 3, size, size) normalised.

    Pad to a square at the bottom/right with 0 (as transformers' Owlv2ImageProcessor
    does), resize bilinearly with antialiasing (the processor blurs with a Gaussian, then
    resizes: close, not bit-identical), normalise with the processor's mean and std.
    """

    size: tuple[int, int]
    mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    std: tuple[float, ...] = OPENAI_CLIP_STD

    @classmethod
    def from_pretrained(cls, path: str, local_files_only: bool = True) -> "OwlPreprocess":
        with open(_resolve_file(path, "preprocessor_config.json", local_files_only)) as f:
            cfg = json.load(f)
        size = cfg.get("size", {"height": 960, "width": 960})
        size = (size, size) if isinstance(size, int) else (size["height"], size["width"])
        return cls(size, tuple(cfg.get("image_mean", OPENAI_CLIP_MEAN)), tuple(cfg.get("image_std", OPENAI_CLIP_STD)))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        h, w = images.shape[-2:]
        side = max(h, w)
        x = F.pad(images.float(), (0, side - w, 0, side - h), value=0.0)  # (N, 3, side, side)
        if (side, side) != self.size:
            x = F.interpolate(x, size=self.size, mode="bilinear", antialias=True, align_corners=False).clamp(0, 1)
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std


class OwlDetector:
    """A frozen transformers Owlv2ForObjectDetection from a local folder, as a `Detector`.

    Keeps, per image and query, detections scoring >= `threshold`, after NMS at
    `nms_iou`, at most `max_per_query` of them. Boxes come back normalised to the
    unpadded image.
    """

    def __init__(
        self,
        path: str,
        *,
        device: str | torch.device = "cpu",
        threshold: float = 0.1,
        nms_iou: float = 0.5,
        max_per_query: int = 16,
        batch_size: int = 16,
        local_files_only: bool = True,
    ):
        from transformers import AutoTokenizer, Owlv2ForObjectDetection

        _check_unit("threshold", threshold)
        _check_unit("nms_iou", nms_iou)
        _check_positive("max_per_query", max_per_query)
        _check_positive("batch_size", batch_size)
        self.device = torch.device(device)
        model = Owlv2ForObjectDetection.from_pretrained(path, local_files_only=local_files_only)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_files_only)
        self.max_length = self.model.config.text_config.max_position_embeddings
        self.preprocess = OwlPreprocess.from_pretrained(path, local_files_only)
        self.threshold, self.nms_iou, self.max_per_query, self.batch_size = threshold, nms_iou, max_per_query, batch_size

    @torch.no_grad()
    def raw(self, images: torch.Tensor, queries: list[list[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores (N, P, Q) in [0, 1] (padded queries score 0) and boxes (N, P, 4) xyxy on the unpadded image."""
        n, _, h, w = images.shape
        q = max(1, max(len(x) for x in queries))
        texts = [x[j] if j < len(x) else "" for x in queries for j in range(q)]
        tok = self.tokenizer(texts, padding="max_length", truncation=True, max_length=self.max_length, return_tensors="pt")
        ids, mask = tok.input_ids, tok.attention_mask
        pad = torch.tensor([j >= len(x) for x in queries for j in range(q)])
        ids[pad], mask[pad] = 0, 0  # OWL masks a query whose first token id is 0
        mask[pad, 0] = 1  # one visible token keeps the masked query's attention finite
        out = self.model(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            pixel_values=self.preprocess(images.to(self.device)),
        )  # fmt: skip
        scores = torch.sigmoid(out.logits.float()).cpu()  # (N, P, Q)
        side = max(h, w)  # boxes are normalised to the padded square; rescale to the image
        scale = torch.tensor([side / w, side / h, side / w, side / h])
        boxes = (cxcywh_to_xyxy(out.pred_boxes.float().cpu()) * scale).clamp(0, 1)  # (N, P, 4)
        return scores, boxes

    def detect(self, images: torch.Tensor, queries: list[list[str]]) -> list[list[Detection]]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"detect takes images (N, 3, H, W), got {tuple(images.shape)}")
        if len(queries) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(queries)} query lists")
        out: list[list[Detection]] = []
        for i in range(0, images.shape[0], self.batch_size):
            chunk_q = queries[i : i + self.batch_size]
            scores, boxes = self.raw(images[i : i + self.batch_size], chunk_q)
            for s, b, qs in zip(scores, boxes, chunk_q):
                dets = []
                for k, label in enumerate(qs):
                    idx = torch.nonzero(s[:, k] >= self.threshold).flatten()
                    keep = idx[nms(b[idx], s[idx, k], self.nms_iou)][: self.max_per_query]
                    dets += [Detection(label, float(s[p, k]), tuple(b[p].tolist())) for p in keep]
                out.append(sorted(dets, key=lambda d: -d.score))
        return out


# ---------------------------------------------------------------------------------------
# Colour of a detection
# ---------------------------------------------------------------------------------------

NAMED_RGB = {
    "red": (1.0, 0.0, 0.0), "orange": (1.0, 0.55, 0.0), "yellow": (1.0, 1.0, 0.0), "green": (0.0, 0.7, 0.0),
    "blue": (0.0, 0.0, 1.0), "purple": (0.5, 0.0, 0.5), "pink": (1.0, 0.75, 0.8), "brown": (0.55, 0.3, 0.1),
    "black": (0.0, 0.0, 0.0), "white": (1.0, 1.0, 1.0),
}  # fmt: skip
FOREGROUND_DISTANCE = 0.2  # RGB distance from the background colour above which a pixel is the object's


def _crop(image: torch.Tensor, box) -> torch.Tensor:
    """(3, H, W) -> (3, h, w) inside the normalised xyxy box, at least one pixel."""
    h, w = image.shape[-2:]
    x0, y0 = min(math.floor(box[0] * w), w - 1), min(math.floor(box[1] * h), h - 1)
    x1, y1 = max(math.ceil(box[2] * w), x0 + 1), max(math.ceil(box[3] * h), y0 + 1)
    return image[:, y0:y1, x0:x1]


class MeanColor:
    """Nearest named colour (NAMED_RGB) to the mean of the box's foreground pixels.

    Background = the median colour of the image's border pixels; foreground = crop pixels
    farther than FOREGROUND_DISTANCE from it (all crop pixels if none are).
    """

    def __call__(self, image: torch.Tensor, dets: Sequence[Detection]) -> list[str]:
        border = torch.cat([image[:, 0], image[:, -1], image[:, :, 0], image[:, :, -1]], dim=1)  # (3, 2H+2W)
        background = border.median(dim=1).values
        palette = torch.tensor(list(NAMED_RGB.values()))  # (K, 3)
        names = []
        for d in dets:
            pixels = _crop(image, d.box).flatten(1).T  # (n, 3)
            fg = pixels[(pixels - background).norm(dim=1) > FOREGROUND_DISTANCE]
            mean = (fg if len(fg) else pixels).mean(0)
            names.append(list(NAMED_RGB)[int(((palette - mean) ** 2).sum(1).argmin())])
        return names


class ClipColor:
    """CLIP zero-shot colour of each box crop among GENEVAL_COLORS ("a photo of a {color} {class}")."""

    def __init__(self, clip_path: str, device: str | torch.device = "cpu", local_files_only: bool = True):
        from digenrl.rewards.clip_models import ClipBackbone

        self.clip = ClipBackbone(clip_path, device=device, local_files_only=local_files_only)

    def __call__(self, image: torch.Tensor, dets: Sequence[Detection]) -> list[str]:
        if not dets:
            return []
        crops = torch.stack(
            [F.interpolate(_crop(image, d.box)[None], size=self.clip.preprocess.crop, mode="bilinear")[0] for d in dets]
        )  # (n, 3, crop_h, crop_w): one size so the batch stacks; CLIP's preprocess then normalises
        img = self.clip.image_embeds(crops)  # (n, D)
        names = []
        for d, e in zip(dets, img):
            text = self.clip.text_embeds([f"a photo of a {c} {d.label}" for c in GENEVAL_COLORS])  # (10, D)
            names.append(GENEVAL_COLORS[int((text @ e).argmax())])
        return names


# ---------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------


def _check_unit(key: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"geneval-detector: {key} must be a number in [0, 1], got {value!r}")


def _check_positive(key: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"geneval-detector: {key} must be an integer >= 1, got {value!r}")


def _named_metadata(spec: str) -> dict[str, dict] | None:
    """prompt -> metadata of a named prompt set (both splits for a bare name), or None when
    `spec` names no set (then it is a jsonl path)."""
    from digenrl.prompt_sets import parse_spec, prompt_metadata

    parsed = parse_spec(str(spec))
    if parsed is None:
        return None
    name, split = parsed
    out: dict[str, dict] = {}
    for one in [split] if split else ["train", "test"]:
        out.update(prompt_metadata(name, one))
    return out


class GenEvalDetector:
    """(images (B, 3, H, W) in [0, 1], prompts) -> fraction of GenEval clauses met (B,) in [0, 1].

    path: a local OWLv2 folder (Owlv2ForObjectDetection + tokenizer + preprocessor_config.json).
    metadata: a GenEval metadata jsonl, or a named prompt set that carries metadata ("geneval":
        its train and test splits; "geneval:test": one split; digenrl.prompt_sets, fetched and
        checked like data.prompts); prompts not in it must be toy-world prompts.
    clip_path: a CLIP folder for colour; without it, MeanColor (flat-colour images only).
    threshold / counting_threshold: minimum detection score (the latter for "counting" prompts).
    """

    name = "geneval-detector"

    def __init__(
        self,
        path: str,
        *,
        metadata: str | None = None,
        clip_path: str | None = None,
        device: str | torch.device = "cpu",
        threshold: float = 0.3,
        counting_threshold: float = 0.9,
        nms_iou: float = 0.5,
        max_objects: int = 16,
        batch_size: int = 16,
        local_files_only: bool = True,
    ):
        _check_unit("threshold", threshold)
        _check_unit("counting_threshold", counting_threshold)
        _check_unit("nms_iou", nms_iou)
        _check_positive("max_objects", max_objects)
        _check_positive("batch_size", batch_size)
        named = _named_metadata(metadata) if metadata else None
        for key, where in (("path", path), ("clip_path", clip_path), ("metadata", None if named else metadata)):
            if where is not None and local_files_only and not os.path.exists(str(where)):
                raise ValueError(f"geneval-detector: {key}={where!r} does not exist (nothing is downloaded)")
        self.metadata: dict[str, dict] = named if named is not None else (
            geneval.load_metadata(metadata) if metadata else {})
        self.threshold, self.counting_threshold = threshold, counting_threshold
        self.detector: Detector = OwlDetector(
            path, device=device, threshold=min(threshold, counting_threshold), nms_iou=nms_iou,
            max_per_query=max_objects, batch_size=batch_size, local_files_only=local_files_only,
        )  # fmt: skip
        self.color = ClipColor(clip_path, device, local_files_only) if clip_path else MeanColor()

    def metadata_for(self, prompt: str) -> Mapping:
        """The prompt's GenEval metadata: from the jsonl, else converted from a toy-world prompt."""
        if prompt in self.metadata:
            return self.metadata[prompt]
        try:
            return geneval.toy_metadata(ToyPrompt.parse(prompt))
        except ValueError:
            raise ValueError(
                f"geneval-detector: no metadata for prompt {prompt!r}: it is neither in the metadata jsonl "
                f"({len(self.metadata)} prompts) nor a toy-world prompt"
            ) from None

    @torch.no_grad()
    def score(self, images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
        """{"reward", "strict", "count", "color", "position", "exclude"}: each (B,) float32 on the CPU."""
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"geneval-detector scores images (B, 3, H, W), got {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        metas = [self.metadata_for(p) for p in prompts]  # every prompt resolves before the detector runs
        detections = self.detector.detect(images, [geneval.query_classes(m) for m in metas])
        x = images.detach().float().cpu().clamp(0, 1)
        rows = []
        for image, meta, dets in zip(x, metas, detections):
            floor = self.counting_threshold if meta.get("tag") == "counting" else self.threshold
            objects: dict[str, list[Detection]] = {}
            for d in dets:  # already highest score first
                if d.score >= floor:
                    objects.setdefault(d.label, []).append(d)
            color_of = lambda d, image=image: self.color(image, [d])[0]  # noqa: E731
            rows.append(geneval.summarize(geneval.score_detections(meta, objects, color_of, tuple(x.shape[-2:]))))
        keys = ("reward", "strict", *geneval.CLAUSES)
        return {k: torch.tensor([r[k] for r in rows], dtype=torch.float32).view(-1) for k in keys}

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.score(images, prompts)["reward"]

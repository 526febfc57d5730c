"""Programmatic rewards: prompt alignment on the toy world, and JPEG (in)compressibility.

`ToyGenEval` judges an image against its prompt the way GenEval judges real images with
a detector, but by program: colour (nearest palette colour per pixel), count (connected
components), shape (intersection over union of each component with the asked shape drawn
in the component's bounding box, as the world draws it) and position (share of the
object's pixels in the named half). GenEval
scores 0/1 per prompt; RL needs partial credit, so the reward is the mean of the four
soft criteria in [0, 1] (count scores 1 / (1 + |found - asked|), so every spurious
object removed helps), and `strict` reports the GenEval-style all-correct rate.
"""

from __future__ import annotations

import io

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from digenrl.toy.world import COLORS, ToyPrompt, shape_mask

_PALETTE = torch.tensor(list(COLORS.values()), dtype=torch.float32)  # (K, 3)
_COLOR_INDEX = {c: i for i, c in enumerate(COLORS)}
FOREGROUND_MIN = 0.5  # brightest channel above half = an object pixel (background is black, objects >= 0.9)
MIN_AREA = 4  # components smaller than this are speckle, not objects
STRICT_SHAPE_IOU = 0.7  # drawn shapes reach 0.9-1.0 against their template, a wrong shape 0.5-0.85


def _components(mask: torch.Tensor) -> torch.Tensor:
    """8-connected component labels of a (B, H, W) bool mask; 0 = background."""
    b, h, w = mask.shape
    labels = torch.arange(1, h * w + 1, dtype=torch.float32).reshape(1, h, w).expand(b, h, w) * mask
    labels = labels.unsqueeze(1)
    m = mask.unsqueeze(1).float()
    while True:  # max-propagation converges in (component diameter) iterations
        grown = F.max_pool2d(labels, 3, stride=1, padding=1) * m
        if torch.equal(grown, labels):
            return labels.squeeze(1).long()
        labels = grown


def _shape_iou(component: torch.Tensor, shape: str) -> float:
    """IoU of a (H, W) component mask with `shape` drawn in its bounding box (side = the longer edge).

    A bounding-box fill ratio would call a ragged or fragmented blob a triangle; the
    template has to be matched pixel for pixel, and an elongated blob matches no shape.
    """
    ys, xs = torch.nonzero(component, as_tuple=True)
    y0, y1, x0, x1 = int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1
    r = max(y1 - y0, x1 - x0) / 2
    template = torch.from_numpy(shape_mask(shape, (y0 + y1) / 2, (x0 + x1) / 2, r, component.shape[-1]))
    union = int((template | component).sum())
    return int((template & component).sum()) / union


class ToyGenEval:
    """(images (B,3,H,W) in [0,1], toy prompts) -> reward (B,) in [0, 1]."""

    name = "toy-geneval"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return self.score(images, prompts)["reward"]

    def score(self, images: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"toy-geneval scores images (B, 3, H, W), got {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        specs = [ToyPrompt.parse(p) for p in prompts]
        x = images.detach().float().cpu().clamp(0, 1)
        b, _, h, w = x.shape
        foreground = x.amax(dim=1) > FOREGROUND_MIN  # (B, H, W)
        dist = ((x.permute(0, 2, 3, 1).unsqueeze(-2) - _PALETTE) ** 2).sum(-1)  # (B, H, W, K)
        nearest = dist.argmin(-1)
        target = torch.tensor([_COLOR_INDEX[s.color] for s in specs]).view(b, 1, 1)
        on_target = foreground & (nearest == target)
        labels = _components(on_target)

        out = {k: torch.zeros(b) for k in ("color", "count", "shape", "position", "reward", "strict")}
        yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        for i, spec in enumerate(specs):
            n_fg = int(foreground[i].sum())
            color = float(on_target[i].sum()) / n_fg if n_fg else 0.0
            ids, areas = labels[i][labels[i] > 0].unique(return_counts=True)
            objects = [int(k) for k, a in zip(ids, areas) if a >= MIN_AREA]
            n = len(objects)
            count = 1.0 / (1.0 + abs(n - spec.count))  # partial credit that keeps rising toward the right count
            shape_scores = []
            for k in objects:
                shape_scores.append(_shape_iou(labels[i] == k, spec.shape))
            shape = float(np.mean(shape_scores)) if shape_scores else 0.0
            criteria = [color, count, shape]
            position = 1.0
            if spec.position != "anywhere":
                ys, xs = yy[on_target[i]].float() + 0.5, xx[on_target[i]].float() + 0.5
                inside = {"left": xs < w / 2, "right": xs > w / 2, "top": ys < h / 2, "bottom": ys > h / 2}
                position = float(inside[spec.position].float().mean()) if len(xs) else 0.0
                criteria.append(position)
            out["color"][i], out["count"][i], out["shape"][i], out["position"][i] = color, count, shape, position
            out["reward"][i] = float(np.mean(criteria))
            out["strict"][i] = float(color >= 0.9 and count == 1.0 and shape >= STRICT_SHAPE_IOU and position >= 0.9)
        return out


def _jpeg_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    # round(255 x) clamped to 0..255 (= round(255 clamp(x, 0, 1))) with one temporary, not four
    x = images.detach().float().cpu().mul(255).round_().clamp_(0, 255).to(torch.uint8)
    if x.ndim == 5:  # video: all frames of a sample
        x = x.flatten(0, 1)
        frames = images.shape[1]
    else:
        frames = 1
    sizes = []
    # (N, H, W, 3) made contiguous once: Image.fromarray copies a strided image (tobytes) per image,
    # a quarter of this loop's time for 64x64 images
    for img in x.permute(0, 2, 3, 1).contiguous().numpy():
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32).view(-1, frames).mean(1)


class JpegCompressibility:
    """-(JPEG size in kB at quality 95): smaller files score higher (the DDPO/Flow-GRPO task)."""

    name = "jpeg-compressibility"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return -_jpeg_kb(images)


class JpegIncompressibility:
    """+(JPEG size in kB at quality 95): more detail scores higher."""

    name = "jpeg-incompressibility"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return _jpeg_kb(images)

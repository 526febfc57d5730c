"""A procedural world of coloured shapes with text prompts: the default run's data.

Prompts name a count, a colour, a shape and (optionally) a position, e.g. "two red
circles on the left". Images are drawn exactly from their prompt, so a base generator can
be pretrained on them by flow matching, and a reward can check alignment by program
(`digenrl.rewards.toy`) the way GenEval checks real images with a detector.

Held-out prompts: a fixed, seed-independent ~20% of the attribute combinations never
appear in RL training; evaluation reports reward on those.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import numpy as np
import torch

from digenrl.math import rng

COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.2),
    "blue": (0.15, 0.25, 0.95),
    "yellow": (0.95, 0.9, 0.1),
}
SHAPES = ("square", "circle", "triangle")
COUNTS = {1: "a", 2: "two"}
POSITIONS = ("anywhere", "left", "right", "top", "bottom")
BACKGROUND = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class ToyPrompt:
    color: str
    shape: str
    count: int
    position: str

    @property
    def text(self) -> str:
        noun = self.shape if self.count == 1 else self.shape + "s"
        where = "" if self.position == "anywhere" else f" on the {self.position}"
        return f"{COUNTS[self.count]} {self.color} {noun}{where}"

    @staticmethod
    def parse(text: str) -> "ToyPrompt":
        """Inverse of `.text`; raises ValueError naming the grammar on anything else."""
        words = text.strip().lower().split()
        try:
            count = {v: k for k, v in COUNTS.items()}[words[0]]
            color = words[1]
            shape = words[2][:-1] if count > 1 else words[2]
            position = words[5] if len(words) == 6 and words[3:5] == ["on", "the"] else "anywhere"
            if len(words) not in (3, 6) or color not in COLORS or shape not in SHAPES or position not in POSITIONS:
                raise KeyError
        except (KeyError, IndexError):
            raise ValueError(
                f"not a toy prompt: {text!r}; grammar: '<a|two> <{'|'.join(COLORS)}> "
                f"<{'|'.join(SHAPES)}>[s] [on the <{'|'.join(POSITIONS[1:])}>]'"
            ) from None
        return ToyPrompt(color, shape, count, position)


@lru_cache(maxsize=None)
def all_prompts() -> tuple[ToyPrompt, ...]:
    return tuple(
        ToyPrompt(c, s, n, p) for c in COLORS for s in SHAPES for n in COUNTS for p in POSITIONS
    )


def _is_held_out(p: ToyPrompt) -> bool:
    return rng.key(sum(map(ord, p.text))) % 5 == 0 and p.position != "anywhere"


@lru_cache(maxsize=None)
def split_prompts() -> tuple[tuple[ToyPrompt, ...], tuple[ToyPrompt, ...]]:
    """(train, held_out): fixed for every seed, so eval numbers compare across runs."""
    train = tuple(p for p in all_prompts() if not _is_held_out(p))
    held = tuple(p for p in all_prompts() if _is_held_out(p))
    return train, held


def shape_mask(shape: str, cy: float, cx: float, r: float, size: int) -> np.ndarray:
    """(size, size) bool: pixels whose centres lie in `shape` of half-size r centred at (cy, cx)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    if shape == "square":
        return (np.abs(yy - cy) <= r) & (np.abs(xx - cx) <= r)
    if shape == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r**2
    # upward isosceles triangle inside the (2r x 2r) box
    top, bottom = cy - r, cy + r
    half_width = (yy - top) / (2 * r) * r
    return (yy >= top) & (yy <= bottom) & (np.abs(xx - cx) <= half_width)


def _region(position: str, size: int) -> tuple[float, float, float, float]:
    """(y0, y1, x0, x1) where object centres may go."""
    lo, mid, hi = 0.0, size / 2, float(size)
    return {
        "anywhere": (lo, hi, lo, hi),
        "left": (lo, hi, lo, mid),
        "right": (lo, hi, mid, hi),
        "top": (lo, mid, lo, hi),
        "bottom": (mid, hi, lo, hi),
    }[position]


def draw(prompt: ToyPrompt, size: int, gen: np.random.Generator) -> np.ndarray:
    """One image (3, size, size) float32 in [0, 1] that satisfies `prompt`."""
    return draw_with_boxes(prompt, size, gen)[0]


def draw_with_boxes(prompt: ToyPrompt, size: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`draw`, plus each object's box: (count, 4) float32 x0, y0, x1, y1 normalised to [0, 1].

    Draws the same image as `draw` from the same generator state (the detector's training
    labels come from here). The box is the shape's (2r x 2r) extent, clipped to the image.
    """
    img = np.zeros((3, size, size), dtype=np.float32)
    r = size * 0.14  # half-size: ~9 px objects on 32 px, two fit side by side in a half
    y0, y1, x0, x1 = _region(prompt.position, size)
    margin = r + 1
    centres: list[tuple[float, float]] = []
    for _ in range(prompt.count):
        for _attempt in range(50):
            cy = gen.uniform(y0 + margin, y1 - margin)  # whole object inside its region
            cx = gen.uniform(x0 + margin, x1 - margin)
            if all((cy - py) ** 2 + (cx - px) ** 2 > (2.4 * r) ** 2 for py, px in centres):
                break
        centres.append((cy, cx))
        mask = shape_mask(prompt.shape, cy, cx, r, size)
        img[:, mask] = np.asarray(COLORS[prompt.color], dtype=np.float32)[:, None]
    boxes = np.array([(cx - r, cy - r, cx + r, cy + r) for cy, cx in centres], dtype=np.float32) / size
    return img, boxes.clip(0.0, 1.0)


def mislabel(prompt: ToyPrompt, noise: Mapping[str, float], gen: np.random.Generator) -> ToyPrompt:
    """`prompt` with each attribute in `noise` (color, count, position) replaced, with that
    probability, by another value drawn uniformly: a caption that is wrong about the image."""
    values = {"color": tuple(COLORS), "count": tuple(COUNTS), "position": POSITIONS}
    fields = {"color": prompt.color, "shape": prompt.shape, "count": prompt.count, "position": prompt.position}
    for name, p in noise.items():
        if gen.random() < p:
            fields[name] = gen.choice([v for v in values[name] if v != fields[name]]).item()
    return ToyPrompt(**fields)


def sample_batch(
    batch: int, size: int, seed: int, index: int, prompts: tuple[ToyPrompt, ...] | None = None,
    caption_noise: Mapping[str, float] | None = None,
) -> tuple[torch.Tensor, list[str]]:
    """A deterministic batch of (images (B,3,size,size) in [0,1], prompt texts).

    caption_noise: {attribute: probability} of captions that name another colour, count or
    position than the image shows (`mislabel`), drawn after the images; None = exact captions.
    """
    pool = prompts if prompts is not None else all_prompts()
    gen = np.random.default_rng(rng.key(seed, rng.TRAIN_DATA, index))
    chosen = [pool[i] for i in gen.integers(0, len(pool), size=batch)]
    images = np.stack([draw(p, size, gen) for p in chosen])
    if caption_noise:
        bad = set(caption_noise) - {"color", "count", "position"}
        if bad:
            raise ValueError(f"caption noise applies to color, count and position, not {sorted(bad)}")
        chosen = [mislabel(p, caption_noise, gen) for p in chosen]
    return torch.from_numpy(images), [p.text for p in chosen]

"""Prompt sources: which prompt (and conditioning image) each group of each RL step gets.

The choice is a pure function of (seed, step, group): epoch-wise shuffles of the prompt
list, walked in order. The "data cursor" of a checkpoint is therefore just the number of
prompts consumed, and any worker can tell which prompt a group has.

Conditioned models (edit, image-to-video) read a .jsonl file of rows
{"prompt": ..., "image": path relative to the file}. Edit datasets repeat instructions
across images, so the prompt text is no key: a row is its index, and the sample
coordinates (step, group) name it on every worker (`PromptSource.index`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:  # the configuration reads this module's names: torch only where tensors are made
    import torch

ROWS_SUFFIX = ".jsonl"  # prompt files with a conditioning image per row


@dataclass(frozen=True)
class PromptRows:
    """A prompt list and, for conditioned models, one image file per prompt."""

    prompts: list[str]
    images: Optional[list[str]] = None  # absolute paths, images[i] belongs to prompts[i]


def read_rows(path: str | Path) -> PromptRows:
    """A .jsonl prompt file: one {"prompt": str, "image": str} object per line (image optional,
    but on every row or on none; relative to the file's folder)."""
    path = Path(path)
    prompts, images = [], []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f'{path}:{n}: each row needs "prompt": a string')
        prompts.append(row["prompt"])
        if "image" in row:
            image = path.parent / str(row["image"])
            if not image.is_file():
                raise ValueError(f"{path}:{n}: image {row['image']!r} not found (paths are relative to the file)")
            images.append(str(image.resolve()))
        if len(images) not in (0, len(prompts)):
            raise ValueError(f'{path}:{n}: "image" must be on every row or on none')
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} has no prompts")
    return PromptRows(prompts, images or None)


def load_rows(spec: str, *, held_out: bool = False, progress: bool = False) -> PromptRows:
    """What `spec` names as rows: a .jsonl file (prompts, maybe images) or any `load_prompts` form."""
    if spec.endswith(ROWS_SUFFIX):
        if not Path(spec).exists():
            raise ValueError(f"prompt file {spec!r} not found")
        return read_rows(spec)
    return PromptRows(load_prompts(spec, held_out=held_out, progress=progress))


def check_conditioning(rows: PromptRows, model: str, key: str) -> None:
    """Images exactly for conditioned families (a `conditioning` in digenrl.models.families);
    ValueError naming `key` otherwise."""
    from digenrl.models.families import conditioning_kind, names_with

    kind = conditioning_kind(model)
    if kind is not None and rows.images is None:
        raise ValueError(f'{key}: {model} is conditioned on a {kind} per prompt; give a {ROWS_SUFFIX} file of '
                         f'{{"prompt": ..., "image": ...}} rows')
    if kind is None and rows.images is not None:
        raise ValueError(f"{key}: {model} takes prompts only, but the rows give images (use a conditioned "
                         f"family: {', '.join(names_with('conditioning'))})")


def load_images(paths: Sequence[str], height: int, width: int) -> torch.Tensor:
    """Image files -> (B, 3, height, width) float32 in [0, 1] (RGB; resized, bicubic, when they differ)."""
    import torch
    from PIL import Image

    out = []
    for path in paths:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (width, height):
                im = im.resize((width, height), Image.Resampling.BICUBIC)
            out.append(torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(height, width, 3))
    return torch.stack(out).permute(0, 3, 1, 2).float() / 255.0


def load_prompts(spec: str, *, held_out: bool = False, progress: bool = False) -> list[str]:
    """The prompts `spec` names: 'toy' / 'toy-held-out' (the toy world's split), a named set
    ('pickscore', 'pickscore:test', ...; digenrl/prompt_sets; a bare name means the test split
    when `held_out`, else the train split), a text file, one prompt per line, or a .jsonl file
    of rows (their prompts; `load_rows` gives their images too)."""
    if spec.endswith(ROWS_SUFFIX):
        return load_rows(spec).prompts
    if spec in ("toy", "toy-held-out"):
        from digenrl.toy.world import split_prompts

        train, held = split_prompts()
        return [p.text for p in (held if spec == "toy-held-out" else train)]
    from digenrl.prompt_sets import PROMPT_SETS, load_set, parse_spec

    if parse_spec(spec) is not None:
        return load_set(spec, held_out=held_out, progress=progress)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"prompt file {spec!r} not found (or use 'toy' / 'toy-held-out', or a named set: "
                         f"{', '.join(PROMPT_SETS)}, NAME:SPLIT for a split)")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not prompts:
        raise ValueError(f"prompt file {spec!r} has no prompts")
    return prompts


class PromptSource:
    """images: one file per prompt (conditioned models), else None."""

    def __init__(self, prompts: list[str], seed: int, groups_per_step: int, images: Optional[list[str]] = None):
        if images is not None and len(images) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(images)} images")
        self.prompts = prompts
        self.images = images
        self.seed = seed
        self.groups_per_step = groups_per_step
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            from digenrl.math import rng

            self._perms = {epoch: rng.permutation(len(self.prompts), self.seed, rng.PROMPT, epoch)}
        return self._perms[epoch]

    def index(self, step: int, group: int) -> int:
        """The data row of (step, group): a pure function of (seed, step, group)."""
        pos = step * self.groups_per_step + group
        epoch, i = divmod(pos, len(self.prompts))
        return self._perm(epoch)[i]

    def prompt(self, step: int, group: int) -> str:
        return self.prompts[self.index(step, group)]

    def image(self, step: int, group: int) -> Optional[str]:
        """The conditioning image file of (step, group), or None without images."""
        return None if self.images is None else self.images[self.index(step, group)]

    def step_prompts(self, step: int) -> list[str]:
        return [self.prompt(step, g) for g in range(self.groups_per_step)]

    def step_images(self, step: int) -> Optional[list[str]]:
        return None if self.images is None else [self.image(step, g) for g in range(self.groups_per_step)]

    def cursor(self, next_step: int) -> int:
        """Prompts consumed before `next_step` (saved in checkpoints for inspection)."""
        return next_step * self.groups_per_step

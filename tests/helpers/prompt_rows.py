"""Prompt files the conditioned-family tests write: .jsonl rows {prompt, image}."""

from __future__ import annotations

import json

import torch


def write_rows(folder, prompts, images=None, name="rows.jsonl"):
    """A .jsonl prompt file; images (N, 3, H, W) in [0, 1] are saved as PNGs next to it."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, p in enumerate(prompts):
        row = {"prompt": p}
        if images is not None:
            (folder / "img").mkdir(exist_ok=True)
            arr = (images[i] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            Image.fromarray(arr).save(folder / "img" / f"{i}.png")
            row["image"] = f"img/{i}.png"
        lines.append(json.dumps(row))
    (folder / name).write_text("\n".join(lines) + "\n")
    return folder / name

"""Image and video files of `digenrl sample`: one file per sample, and a grid with prompts.

    save_sample(x, path)            (3, H, W) -> PNG; (F, 3, H, W) -> animated GIF (Pillow)
    save_wav(wave, path, rate)      (channels, samples) in [-1, 1] -> 16-bit PCM WAV (stdlib
                                    `wave`): the audio track of an audio family's video (ltx2)
    save_prompt_grid(x, prompts, k, path)
                                    one row per prompt: its text, then its k samples
                                    (videos: their first frame)

Pixels are float in [0, 1] (the rollout's decoded images). Videos go to GIF through
Pillow, already a dependency, rather than MP4 through an optional encoder.
"""

from __future__ import annotations

import math
import wave as wavfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

VIDEO_FPS = 8  # GIF frame rate of sampled videos
LABEL_CHARS = 48  # prompt text per grid row before it is cut with '...'


def to_pil(image: torch.Tensor) -> Image.Image:
    """(3, H, W) float in [0, 1] -> RGB PIL image."""
    arr = (image.detach().float().clamp(0, 1).permute(1, 2, 0).cpu().numpy() * 255).round().astype(np.uint8)
    return Image.fromarray(arr)


def save_sample(x: torch.Tensor, path: Path) -> Path:
    """One sample to `path` with its suffix set: .png for (3, H, W), .gif for (F, 3, H, W)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if x.ndim == 3:
        out = path.with_suffix(".png")
        to_pil(x).save(out)
        return out
    if x.ndim != 4:
        raise ValueError(f"a sample is (3, H, W) or (F, 3, H, W), got shape {tuple(x.shape)}")
    out = path.with_suffix(".gif")
    frames = [to_pil(f) for f in x]
    frames[0].save(out, save_all=True, append_images=frames[1:], duration=round(1000 / VIDEO_FPS), loop=0)
    return out


def save_wav(wave: torch.Tensor, path: Path, rate: int) -> Path:
    """A (channels, samples) float waveform in [-1, 1] to `path` (suffix .wav) as 16-bit PCM at
    `rate` Hz, channels interleaved; values outside [-1, 1] are clipped."""
    if wave.ndim != 2:
        raise ValueError(f"a waveform is (channels, samples), got shape {tuple(wave.shape)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    out = path.with_suffix(".wav")
    pcm = (wave.detach().float().clamp(-1, 1).cpu().numpy() * 32767).round().astype("<i2")  # (C, N)
    with wavfile.open(str(out), "wb") as f:
        f.setnchannels(pcm.shape[0])
        f.setsampwidth(2)
        f.setframerate(int(rate))
        f.writeframes(np.ascontiguousarray(pcm.T).tobytes())  # frames: one sample of every channel
    return out


def save_prompt_grid(x: torch.Tensor, prompts: list[str], k: int, path: Path) -> Path:
    """(P * k, 3, H, W) prompt-major samples (or (P * k, F, 3, H, W): first frames) -> one
    PNG, row i = the text of prompts[i] then its k samples; small images are upscaled so a
    cell is at least 64 px high."""
    if x.ndim == 5:
        x = x[:, 0]
    if x.shape[0] != len(prompts) * k:
        raise ValueError(f"{x.shape[0]} samples for {len(prompts)} prompts x {k} samples each")
    h, w = x.shape[-2:]
    scale = max(1, math.ceil(64 / h))
    ch, cw = h * scale, w * scale
    font = ImageFont.load_default()
    labels = [p if len(p) <= LABEL_CHARS else p[: LABEL_CHARS - 3] + "..." for p in prompts]
    probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    label_w = max(probe.textlength(text, font=font) for text in labels) + 8 if labels else 0
    pad = 2
    canvas = Image.new("RGB", (int(label_w) + k * (cw + pad) - pad, len(prompts) * (ch + pad) - pad), "white")
    draw = ImageDraw.Draw(canvas)
    for i, text in enumerate(labels):
        top = i * (ch + pad)
        draw.text((4, top + ch // 2 - 6), text, fill="black", font=font)
        for j in range(k):
            cell = to_pil(x[i * k + j]).resize((cw, ch), Image.NEAREST)
            canvas.paste(cell, (int(label_w) + j * (cw + pad), top))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path)
    return path

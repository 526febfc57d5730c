"""2x2 patch packing of image latents into tokens (FLUX.1, Qwen-Image), and FLUX image ids.

Same layout as diffusers' FluxPipeline._pack_latents / _unpack_latents
(pipelines/flux/pipeline_flux.py, the staticmethods near `_prepare_latent_image_ids`):
token (i, j) holds channels [c, dy, dx] flattened in that order.
"""

from __future__ import annotations

import torch


def pack_2x2(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, 4C)."""
    b, c, h, w = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"2x2 packing needs even latent height and width, got {h}x{w}")
    x = x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)  # (B, H/2, W/2, C, 2, 2)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_2x2(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, H/2 * W/2, 4C) -> (B, C, H, W); the inverse of pack_2x2."""
    b, n, d = tokens.shape
    if n != (h // 2) * (w // 2):
        raise ValueError(f"{n} tokens do not tile a {h}x{w} latent in 2x2 patches")
    x = tokens.view(b, h // 2, w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)  # (B, C, H/2, 2, W/2, 2)
    return x.reshape(b, d // 4, h, w)


def flux_image_ids(h: int, w: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(H/2 * W/2, 3) RoPE positions (0, row, col) of packed tokens, as FluxPipeline builds them."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)

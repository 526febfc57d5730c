"""The reward service's wire format: images + prompts as safetensors bytes, never pickle.

Version 1
---------
POST /score, Content-Type: application/octet-stream, Content-Length required. The body is a
safetensors file holding

    tensor   "images": uint8 (B, 3, H, W) or (B, F, 3, H, W), pixel / 255 = value in [0, 1]
                       (float16 / bfloat16 / float32 in [0, 1] are accepted too)
    metadata "prompts": JSON list of B strings
             "reward":  optional; if given it must equal the served reward's name

200 -> {"reward": name, "scores": [B floats], "elapsed_s": t}. Errors are JSON
{"error": kind, "message": text}; `RequestError` carries (status, kind, message) for them.

`encode_request` is the client's half, `decode_request` the server's; both check the
batch with `check_media`, so a bad batch fails on the side that made it.
"""

from __future__ import annotations

import json
from typing import Sequence

import torch

from digenrl.rewards.base import check_media

WIRE_DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class RequestError(Exception):
    """A request the server refuses; carries the HTTP status and a message for the client."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def encode_request(
    images: torch.Tensor, prompts: Sequence[str], reward: str | None = None, wire_dtype: str = "uint8"
) -> bytes:
    """float images in [0, 1] + prompts -> safetensors bytes. uint8 quantises to round(255 x)."""
    from safetensors.torch import save

    check_media(images, prompts)
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
    x = images.detach().float().clamp(0.0, 1.0).cpu()
    x = (x * 255.0).round().to(torch.uint8) if wire_dtype == "uint8" else x.to(WIRE_DTYPES[wire_dtype])
    metadata = {"prompts": json.dumps(list(prompts))}
    if reward is not None:
        metadata["reward"] = reward
    return save({"images": x.contiguous()}, metadata=metadata)


def dequantize(images: torch.Tensor) -> torch.Tensor:
    """What the server feeds the reward for a wire tensor: float32 in [0, 1]."""
    return images.float().div_(255.0) if images.dtype == torch.uint8 else images.float()  # in place: one tensor, not two


def decode_request(body: bytes) -> tuple[torch.Tensor, list[str], str | None]:
    """safetensors bytes -> (float32 images in [0, 1], prompts, requested reward name or None).

    Raises RequestError(400) naming what is wrong; never anything else for bad input.
    """
    from safetensors.torch import load

    def bad(message: str) -> RequestError:
        return RequestError(400, "malformed_request", message)

    # The safetensors header: u64 little-endian length, then that many bytes of JSON.
    if len(body) < 8:
        raise bad("body is not a safetensors file (shorter than its 8-byte header length)")
    n = int.from_bytes(body[:8], "little")
    if n > len(body) - 8:
        raise bad(f"body is not a safetensors file (header length {n} exceeds the body)")
    try:
        header = json.loads(body[8 : 8 + n])
        metadata = header.get("__metadata__") or {}
        tensors = load(body)
    except Exception as e:  # noqa: BLE001 - anything the parser says means malformed
        raise bad(f"body is not a valid safetensors file: {e}") from None
    if "images" not in tensors:
        raise bad(f"safetensors body needs a tensor named 'images', got {sorted(tensors)}")
    images = tensors["images"]
    if images.dtype not in WIRE_DTYPES.values():
        raise bad(f"'images' dtype must be one of {sorted(WIRE_DTYPES)}, got {images.dtype}")
    if "prompts" not in metadata:
        raise bad("safetensors metadata needs 'prompts': a JSON list of strings, one per sample")
    try:
        prompts = json.loads(metadata["prompts"])
    except json.JSONDecodeError as e:
        raise bad(f"metadata 'prompts' is not valid JSON: {e}") from None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise bad("metadata 'prompts' must be a JSON list of strings")
    quantised = images.dtype == torch.uint8  # pixel / 255: finite and in [0, 1] by construction
    images = dequantize(images)
    try:
        check_media(images, prompts)
    except (TypeError, ValueError) as e:
        raise bad(str(e)) from None
    if images.shape[0] == 0:
        raise bad("request has no samples")
    if not quantised and not (torch.isfinite(images).all() and images.min() >= 0 and images.max() <= 1):
        raise bad("float 'images' must be finite and in [0, 1]")
    return images, prompts, metadata.get("reward")

"""Counter-based randomness: every draw is a pure function of its coordinates.

The distributed runtime may run any unit on any worker, in any batch layout. For the
on-policy modes to train on bit-identical trajectories, no draw may depend on which
worker ran it or on how samples were batched. So we never keep a running generator:
each draw seeds a fresh `torch.Generator` from a hash of (seed, stream, coordinates...).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Sequence

import torch

# Stream tags keep draws for different purposes independent even at equal coordinates.
PROMPT = 1
INIT_NOISE = 2
SDE_NOISE = 3
WINDOW = 4
EVAL = 5
TRAIN_DATA = 6
TRAINED_STEP = 7  # per-sample draw of trained denoising steps (SampleSpec.draw_levels)
FORWARD_NOISE = 8  # DiffusionNFT's forward-process noise


def key(*parts: int) -> int:
    """Hash integer coordinates to a 63-bit seed (stable across processes and machines)."""
    packed = struct.pack(f"<{len(parts)}q", *(int(p) for p in parts))
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "little") >> 1


def generator(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(key(*parts))


def normal(shape: Sequence[int], *parts: int) -> torch.Tensor:
    """Standard normal float32 tensor of `shape`, a pure function of `parts` (CPU)."""
    return torch.randn(tuple(shape), generator=generator(*parts), dtype=torch.float32)


def per_sample_normal(shape: Sequence[int], coords: Sequence[Sequence[int]]) -> torch.Tensor:
    """Stack one `normal(shape, *c)` per sample: (B, *shape). Batch layout never matters."""
    return torch.stack([normal(shape, *c) for c in coords])


def randint(high: int, *parts: int) -> int:
    return int(torch.randint(high, (1,), generator=generator(*parts)).item())


def permutation(n: int, *parts: int) -> list[int]:
    return torch.randperm(n, generator=generator(*parts)).tolist()

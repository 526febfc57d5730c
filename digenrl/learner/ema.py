"""Exponential moving average of the trainable parameters (evaluation weights).

On an FSDP2-sharded module the parameters are DTensors, so the shadows are too: each rank
averages its own shards, and `digenrl.io.checkpoint.save_sharded` / `load_sharded` write and
read `shadow` in place through DCP (any gang size). `state_dict` then holds DTensors;
`digenrl.learner.sharded.full_tensors(ema.shadow)` gathers whole CPU copies.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class EMA:
    def __init__(self, module: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> None:
        for n, p in self.params.items():
            self.shadow[n].lerp_(p.detach(), 1.0 - self.decay)

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self) -> Iterator[None]:
        """Temporarily swap the EMA weights in (for evaluation)."""
        backup = {n: p.detach().clone() for n, p in self.params.items()}
        for n, p in self.params.items():
            p.copy_(self.shadow[n])
        try:
            yield
        finally:
            for n, p in self.params.items():
                p.copy_(backup[n])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self.shadow.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for n, t in self.shadow.items():
            t.copy_(state[n])

"""DiffusionNFT's old policy: a decayed copy of the trainable weights that samples and anchors.

DiffusionNFT (NVlabs/DiffusionNFT, scripts/train_nft_sd3.py) keeps a second LoRA adapter,
"old", which generates every rollout (:640-659) and gives the loss its v_old (:873-883);
after each epoch it becomes old <- d old + (1 - d) new (:1035-1040), d from
`digenrl.math.loss.nft_old_decay`. Here the old weights are shadows of the trainable
parameters (adapters under LoRA, every weight in a full fine-tune), and `swapped()`
exchanges them with the live ones in place, one tensor at a time: a forward inside it is
the old policy's, and the extra memory is one tensor, not a second model.

On an FSDP2-sharded module the parameters are DTensors and so are the shadows: each rank
keeps and swaps its own shards, and a sharded checkpoint writes them through DCP like the
EMA's (`digenrl.io.checkpoint`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class OldPolicy:
    def __init__(self, module: torch.nn.Module):
        self.params = {n: p for n, p in module.named_parameters() if p.requires_grad}
        self.shadow = {n: p.detach().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def refresh(self, decay: float) -> None:
        """old <- decay old + (1 - decay) new (decay 0: the old policy becomes the new one)."""
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"old-policy decay must be in [0, 1), got {decay}")
        for n, p in self.params.items():
            if decay == 0.0:
                self.shadow[n].copy_(p.detach())
            else:
                self.shadow[n].mul_(decay).add_(p.detach(), alpha=1.0 - decay)

    @torch.no_grad()
    def reset(self) -> None:
        """The old policy becomes the live weights (a trainer that adopted published weights)."""
        self.refresh(0.0)

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The old weights in the module for the duration (no grad through them); the live
        ones back afterwards, bit for bit. Run no backward of a forward made outside it
        across it: the swap writes the parameters in place."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def _swap(self) -> None:
        for n, p in self.params.items():
            live = p.detach().clone()
            p.copy_(self.shadow[n])
            self.shadow[n].copy_(live)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self.shadow.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for n, t in self.shadow.items():
            t.copy_(state[n])

"""Bytes per collective, as a gang rank issues them: the runtime's side of `comm/...` metrics.

    counter = CommCounter()
    count_fsdp(module, counter)          # FSDP2's own hooks: every all-gather / reduce-scatter
    with counter.phase("publish"):       # what the bytes are for (train, publish, generate, ...)
        ...
    counter.take()  -> {"comm/train/all_gather_bytes": ..., ...}   (and resets)

What is counted, per rank (the simulator predicts the same sums, digenrl.sim.gangs):
    all_gather       the gathered output buffer (gang size x padded shard, param dtype)
    reduce_scatter   the input buffer (gang size x padded shard of the gradients, reduce dtype)
    all_reduce       the buffer all-reduced (the cross-gang gradient reduction)
    send             bytes a rank sends point-to-point (the weight relay)
Collectives over a group of one rank move nothing and are not counted.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # FSDP loads where a gang shards (~0.9 s): rollout workers count their sends without it
    from torch.distributed.fsdp import FSDPModule

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "send")


class CommCounter:
    """Bytes and calls per (phase, kind) since the last `take()`."""

    def __init__(self) -> None:
        self.bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.current = "train"

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def add(self, kind: str, tensor: torch.Tensor, group=None) -> None:
        if group is not None and dist.get_world_size(group) <= 1:
            return
        self.bytes[(self.current, kind)] += tensor.numel() * tensor.element_size()
        self.calls[(self.current, kind)] += 1

    def add_bytes(self, kind: str, nbytes: int, phase: str | None = None) -> None:
        """Count `nbytes` of one `kind` call; `phase` names it explicitly (default: the current
        phase). A thread other than the owner's (the weight relay) passes `phase` rather than
        entering `phase()`, which would relabel what the owner's thread counts meanwhile."""
        key = (phase or self.current, kind)
        self.bytes[key] += int(nbytes)
        self.calls[key] += 1

    def take(self) -> dict[str, int]:
        """`comm/<phase>/<kind>_bytes` (and `_calls`) since the last take; resets."""
        out = {}
        for (phase, kind), n in sorted(self.bytes.items()):
            out[f"comm/{phase}/{kind}_bytes"] = n
            out[f"comm/{phase}/{kind}_calls"] = self.calls[(phase, kind)]
        self.bytes.clear()
        self.calls.clear()
        return out


@functools.cache
def _counting_collectives() -> tuple[type, type]:
    """FSDP2's default all-gather and reduce-scatter, each call counted (made on first use)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class CountingAllGather(DefaultAllGather):
        def __init__(self, counter: CommCounter):
            super().__init__()
            self.counter = counter

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            self.counter.add("all_gather", output_tensor, group)
            return super().__call__(output_tensor, input_tensor, group, async_op)

    class CountingReduceScatter(DefaultReduceScatter):
        def __init__(self, counter: CommCounter):
            super().__init__()
            self.counter = counter

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            self.counter.add("reduce_scatter", input_tensor, group)
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    return CountingAllGather, CountingReduceScatter


def fsdp_units(module: torch.nn.Module) -> list[FSDPModule]:
    """Every FSDP2 unit of a sharded module, in module order (the root first)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule)]


def count_fsdp(module: torch.nn.Module, counter: CommCounter) -> None:
    """Route every FSDP2 unit's all-gather and reduce-scatter through `counter`."""
    gather, scatter = _counting_collectives()
    for unit in fsdp_units(module):
        unit.set_custom_all_gather(gather(counter))
        unit.set_custom_reduce_scatter(scatter(counter))

"""The gradient of an RL step, summed over its training units in an order-free way.

An RL step's gradient is the sum of its units' gradients (learner.Learner.accumulate). On one
device the units run in a fixed order; spread over trainers (TSP) and interleaved with
generation (TAG), which trainer runs which unit, and in what order, depends on which worker
finished first. Float32 addition is not associative, so a float32 sum then depends on timing,
and AdamW, which divides each gradient by its own running magnitude, turns that round-off
into weight differences of up to ~1e-5 where a gradient is near zero (LoRA's A matrices on
their second step).

GradSum folds each backward pass's gradient into a float64 running sum and the trainers
all-reduce those float64 sums (digenrl.runtime.gang_rank.all_reduce_grads). Summing n float32 terms in
float64, any two orders differ by at most about n * 2^-29 of a float32 unit in the last place,
so once rounded back to float32 the gradient the optimizer sees is the same for every order,
except for an element whose exact sum falls that close to a float32 rounding boundary (a
chance of about that size per element). The reduction thus no longer depends on which worker
finishes first.

    dtype float64: before_backward() clears p.grad; fold() after the backward pass adds it to
                   the float64 sums and sets p.grad to their float32 rounding, so p.grad
                   always holds the step's gradient so far (the optimizer, gradient clipping
                   and tests read it as usual).
    dtype float32: nothing moves; autograd accumulates p.grad in place, in completion order.

float64 costs 8 bytes per trainable parameter and doubles the cross-trainer all-reduce, so
`train.grad_sum=auto` (resolve_grad_sum) picks it only for up to AUTO_FLOAT64_PARAMS
trainable parameters: LoRA adapters and small models, not a 12B full fine-tune.
"""

from __future__ import annotations

from typing import Optional

import torch

from digenrl.math.kinds import AUTO_FLOAT64_PARAMS, GRAD_SUMS, grad_sum_bytes  # noqa: F401 (sizes, torch-free)


def resolve_grad_sum(choice: str, trainable_params: int) -> torch.dtype:
    """The dtype `train.grad_sum` names (grad_sum_bytes)."""
    return torch.float64 if grad_sum_bytes(choice, trainable_params) == 8 else torch.float32


def is_dtensor(t: torch.Tensor) -> bool:
    """An FSDP2-sharded DTensor (checked by name: importing torch.distributed.tensor costs ~1 s)."""
    return type(t).__name__ == "DTensor"


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself, or this rank's shard of an FSDP2 DTensor."""
    return t.to_local() if is_dtensor(t) else t


class GradSum:
    """Running sums of `params`' gradients since the last optimizer step, in `dtype`."""

    def __init__(self, params: list[torch.nn.Parameter], dtype: torch.dtype = torch.float64):
        self.params = params
        self.dtype = dtype
        self.sums: list[Optional[torch.Tensor]] = [None] * len(params)  # None: not touched yet

    @property
    def folding(self) -> bool:
        """True when gradients move into separate sums (float64); False: p.grad is the sum."""
        return self.dtype == torch.float64

    def before_backward(self) -> None:
        """Clear p.grad before a backward pass (folding), so the pass leaves only its own gradient."""
        if self.folding:
            for p in self.params:
                p.grad = None

    def fold(self) -> None:
        """Add the last backward pass's p.grad to the sums; p.grad becomes their float32 rounding."""
        if not self.folding:
            return
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = local(p.grad)
            if self.sums[i] is None:
                self.sums[i] = g.to(self.dtype, copy=True)
            else:
                self.sums[i].add_(g)
            p.grad = _like_param(p, self.sums[i].to(g.dtype))

    def touched(self) -> list[bool]:
        """Which parameters received a gradient since the last step."""
        if self.folding:
            return [s is not None for s in self.sums]
        return [p.grad is not None for p in self.params]

    def local_sums(self) -> list[Optional[torch.Tensor]]:
        """Each parameter's local sum (this rank's shard), or None where untouched."""
        if self.folding:
            return list(self.sums)
        return [None if p.grad is None else local(p.grad) for p in self.params]

    def set_local_sum(self, i: int, value: torch.Tensor) -> None:
        """Replace parameter i's local sum, and p.grad with it (after a cross-trainer reduction)."""
        p = self.params[i]
        if self.folding:
            self.sums[i] = value.to(self.dtype, copy=True)
        value = value.to(local(p).dtype)
        if p.grad is None:
            p.grad = _like_param(p, value.clone())
        else:
            local(p.grad).copy_(value)

    def clear(self) -> None:
        """Drop the sums (with the optimizer's zero_grad, which drops p.grad)."""
        self.sums = [None] * len(self.params)


def _like_param(p: torch.nn.Parameter, local_value: torch.Tensor) -> torch.Tensor:
    """`local_value` as a gradient of `p` (wrapped as a DTensor with p's sharding if p is one)."""
    if is_dtensor(p):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local_value, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
    return local_value

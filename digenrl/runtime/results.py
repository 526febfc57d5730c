"""What each unit returns to the driver: one small typed record per unit kind.

Workers return these (the big outputs, Trajectories and weights, travel actor to actor as
ObjectRefs and never reach the driver). Every record carries the worker-side wall times
of the unit (`start`, `end`: time.time()), which the event loop turns into trace spans.
No torch import: emulated workers return `Slept` from a torch-free process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class Done:
    start: float
    end: float
    pid: int = 0


@dataclass
class Generated(Done):
    """A Generate segment finished; its Trajectories are the unit's other return value."""


@dataclass
class Rewarded(Done):
    rewards: "torch.Tensor" = None  # (B,) combined reward per sample, row order
    parts: dict = field(default_factory=dict)  # reward name -> (B,)
    group_ids: "torch.Tensor" = None  # (B,) prompt group of each row


@dataclass
class Trained(Done):
    trained: list = field(default_factory=list)  # (step, group, sample, t) trained here


@dataclass
class Stepped(Done):
    """OptimizerStep on one trainer: its learner's metrics and weighted sums before the step."""

    metrics: dict = field(default_factory=dict)
    sums: dict = field(default_factory=dict)
    weight: float = 0.0
    reduce_s: float = 0.0
    publish_s: float = 0.0
    publish_bytes: int = 0


@dataclass
class Synced(Done):
    bytes: int = 0


@dataclass
class Slept(Done):
    """An emulated unit: modelled start/end, the round trip it saw, how far the wall trails."""

    latency: float = 0.0
    behind: float = 0.0
    overhead: dict[str, Any] = field(default_factory=dict)

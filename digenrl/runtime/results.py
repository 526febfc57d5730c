"""What each unit returns to the driver: one small typed record per unit kind.

Workers return these (the big outputs, Trajectories and weights, travel actor to actor as
ObjectRefs and never reach the driver). Every record carries the worker-side wall times
of the unit (`start`, `end`: time.time()), which the event loop turns into trace spans.
No torch import: emulated workers return `Slept` from a torch-free process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    import torch


@dataclass
class Done:
    start: float
    end: float
    pid: int = 0

    def trace_extra(self) -> Optional[dict]:
        """What the unit's trace span records beyond its times (Span.extra), or None."""
        return None


@dataclass
class Generated(Done):
    """A Generate segment finished; its Trajectories are the unit's other return value."""

    comm: dict = field(default_factory=dict)  # a rollout gang rank's collective bytes (sequence parallelism)


@dataclass
class Rewarded(Done):
    rewards: "torch.Tensor" = None  # (B,) combined reward per sample, row order
    parts: dict = field(default_factory=dict)  # reward name -> (B,)
    group_ids: "torch.Tensor" = None  # (B,) prompt group of each row


@dataclass
class Trained(Done):
    trained: list = field(default_factory=list)  # (step, group, sample, t) trained here
    # bytes of the trajectory rows this rank received for the unit (rollout.sampler.payload_bytes:
    # latents, their step index, log-probs); summed over a gang's ranks: transfer/trajectory_bytes
    traj_bytes: int = 0

    def trace_extra(self) -> dict:
        return {"trained": self.trained}  # the run's record of what was trained (RayDriver.trained)


@dataclass
class Stepped(Done):
    """OptimizerStep on one trainer: its learner's metrics and weighted sums before the step."""

    metrics: dict = field(default_factory=dict)
    sums: dict = field(default_factory=dict)
    weight: float = 0.0
    reduce_s: float = 0.0
    publish_s: float = 0.0
    publish_bytes: int = 0
    comm: dict = field(default_factory=dict)  # comm/<phase>/<kind>_bytes this rank issued since its last step
    tag: dict = field(default_factory=dict)  # tag/* of this rank's TAG switches since its last step (runtime/tag_switch.py)


@dataclass
class Synced(Done):
    bytes: int = 0


@dataclass
class Slept(Done):
    """An emulated unit: modelled start/end, the round trip it saw, how far the wall trails."""

    latency: float = 0.0
    behind: float = 0.0
    overhead: dict[str, Any] = field(default_factory=dict)

    def trace_extra(self) -> dict:
        return {"latency_ms": 1e3 * self.latency, "behind_ms": 1e3 * self.behind}


def merge(records: Sequence[Done]) -> Done:
    """One record for a unit that every rank of a gang ran (rank order): rank 0's, spanning
    the first start to the last end, with what each rank did on its own share added up
    (trained coordinates; a step's loss sums, weights and collective bytes)."""
    first = records[0]
    if len(records) == 1:
        return first
    out = replace(first, start=min(r.start for r in records), end=max(r.end for r in records))
    if isinstance(first, Trained):
        out.trained = [c for r in records for c in r.trained]
        out.traj_bytes = sum(r.traj_bytes for r in records)
    elif isinstance(first, Generated):
        out.comm = _add([r.comm for r in records])
    elif isinstance(first, Stepped):
        from digenrl.learner.metrics import merge_sums  # (here: the package imports torch; Slept needs none)

        out.sums = merge_sums([r.sums for r in records])  # (a _max metric: the ranks' max)
        out.weight = sum(r.weight for r in records)
        out.comm = _add([r.comm for r in records])
        out.tag = _add([r.tag for r in records])
        out.reduce_s = max(r.reduce_s for r in records)
    return out


def _add(dicts: Sequence[dict]) -> dict:
    total: dict = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total

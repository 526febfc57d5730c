"""How a Train unit's (sample, trained slot) pairs are cut into forward/backward passes.

TSP, as the DigenRL RFC defines it (verl-project/verl-omni issue 321), is a batched replay:
the trained (sample, timestep) pairs of generated trajectories are flattened into one batch
and trained in one forward and one backward. A Train unit holds rows [first, last) of a
micro-batch and trained slots `slots`; its pairs, slot-major, are

    (s0, first), (s0, first + 1), ..., (s0, last - 1), (s1, first), ..., (sK, last - 1)

`train.pairs_per_pass` = P cuts that list every P pairs (packed: one pass may span several
slots, each pair with its own timestep). P = 0 is the per-timestep reference the RFC's
gradient is checked against: one pass per slot and per chunk of `train.backward_batch` rows
(0 = all rows), as Flow-GRPO's trainer loops over timesteps.

A pass is a list of segments (slot, first row, last row) in that order. Nothing here imports
torch: the simulator counts passes with the same functions the learner cuts them with.
"""

from __future__ import annotations

from typing import Sequence

Segment = tuple[int, int, int]  # (trained slot, first row, last row): rows [first, last) of one slot


def plan_passes(first: int, last: int, slots: Sequence[int], backward_batch: int = 0,
                pairs_per_pass: int = 0) -> list[list[Segment]]:
    """The passes of rows [first, last) x `slots`, each a list of segments (see the module)."""
    if last <= first or not slots:
        return []
    if pairs_per_pass <= 0:
        size = backward_batch or (last - first)
        return [[(t, a, min(a + size, last))] for t in slots for a in range(first, last, size)]
    out: list[list[Segment]] = []
    current: list[Segment] = []
    room = pairs_per_pass
    for t in slots:
        a = first
        while a < last:
            b = min(last, a + room)
            current.append((t, a, b))
            room -= b - a
            a = b
            if room == 0:
                out.append(current)
                current, room = [], pairs_per_pass
    if current:
        out.append(current)
    return out


def pass_count(rows: int, slots: int, backward_batch: int = 0, pairs_per_pass: int = 0) -> int:
    """len(plan_passes(0, rows, range(slots), ...)) without building the list."""
    if rows <= 0 or slots <= 0:
        return 0
    if pairs_per_pass > 0:
        return -(-rows * slots // pairs_per_pass)
    return slots * (-(-rows // backward_batch) if backward_batch else 1)


def pairs_in(segments: Sequence[Segment]) -> int:
    """The (sample, slot) pairs of one pass."""
    return sum(b - a for _, a, b in segments)


def largest_pass(rows: int, slots: int, backward_batch: int = 0, pairs_per_pass: int = 0) -> int:
    """Rows in the largest pass of a unit: what activation memory must hold at once."""
    if rows <= 0 or slots <= 0:
        return 0
    if pairs_per_pass > 0:
        return min(pairs_per_pass, rows * slots)
    return min(backward_batch, rows) if backward_batch else rows

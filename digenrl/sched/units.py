"""Workers and the units of work the scheduler hands them.

Units are frozen (hashable, comparable) so the runtime can key futures by them and the
simulator can put them in heaps. Coordinates:

    step      RL step (0-based); step k is trained by policy version k. A resumed run's units
              start at its checkpoint's step (SchedConfig.first_step): one numbering everywhere
    mb        micro-batch index within the step: whole prompt groups, `groups`
    t         denoising-step index, 0 (noise) .. num_steps (data); [t_start, t_end)
    version   policy version: 0 = initial weights; OptimizerStep(k) produces k + 1
    samples   sample shard: rows [first, last) of the micro-batch, whose rows are its groups'
              samples in order (row r = sample r % samples_per_group of groups[r // samples_per_group]);
              None = every row (unsharded, the default). See SchedConfig.gen_shard /
              train_shard and `rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, TypeVar, Union

Rows = Optional[tuple[int, int]]  # [first, last) rows of a micro-batch; None = all of them

# Pools. "colocated" workers generate *and* train (the flow_grpo / veRL-Omni baseline).
ROLES = ("rollout", "trainer", "reward", "colocated")


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker of one pool: a gang of one or more ranks (devices) that runs each unit
    together. The scheduler never sees ranks (docs/reference/glossary.md). `id` must be unique; it
    orders nothing."""

    id: str
    role: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"Worker.role={self.role!r} is not one of: {', '.join(ROLES)}")


@dataclass(frozen=True, slots=True)
class Generate:
    """Denoising steps [t_start, t_end) of micro-batch `mb` of `step`, with weights `version`.

    t_start > 0 continues a trajectory from a latent x_t handed over at a segment
    boundary; it must run on a worker holding the same `version`. `samples` set: one
    shard of the micro-batch (only those rows); every shard of a micro-batch uses the
    micro-batch's one version.
    """

    step: int
    mb: int
    groups: tuple[int, ...]
    version: int
    t_start: int
    t_end: int
    samples: Rows = None


@dataclass(frozen=True, slots=True)
class Reward:
    """Decode + score one generation fragment as soon as it is fully generated.

    GAP cuts along the generation axis (the DigenRL RFC, verl-omni issue 321): a micro-batch's
    Generate shards are fragments of its prompt groups' generations, run on different
    generators and finishing in any order; each is scored on its own (`samples` = its rows,
    None = the whole, unsharded micro-batch). A group's advantages need every reward of the
    group, so the micro-batch's Train units are made when its last fragment is scored.
    """

    step: int
    mb: int
    groups: tuple[int, ...]
    samples: Rows = None


@dataclass(frozen=True, slots=True)
class Train:
    """Loss + backward on trained slots `t_steps` of a micro-batch (grads accumulate).

    A trained slot is the denoising step itself unless the samples draw their own steps
    (`sampling.window_draw=sample`): then sample c trains its own step in slot t
    (`rollout.sampler.trained_steps`). The name stays `t_steps`: units' reprs are part of
    the simulator's fingerprint (benchmarks/sim_fingerprint.py).

    `traj_version` is the behaviour policy that generated it; the trainer's own version is
    always `step` (step k is trained by version k), so staleness = step - traj_version.
    `samples` set: only those rows of the micro-batch (a sample shard, SchedConfig.train_shard).
    """

    step: int
    mb: int
    groups: tuple[int, ...]
    t_steps: tuple[int, ...]
    traj_version: int
    samples: Rows = None


@dataclass(frozen=True, slots=True)
class OptimizerStep:
    """All-reduce + optimizer step of RL step `step`: a collective over every trainer.

    One unit is handed to each trainer; the step is done when all have reported. It
    produces `version` (= step + 1) and, in disaggregated modes, publishes those weights
    (the publishing cost belongs to this unit's duration).
    """

    step: int
    version: int


@dataclass(frozen=True, slots=True)
class WeightSync:
    """A rollout worker loads published weights `version` (pull model, see scheduler doc)."""

    version: int


Unit = Union[Generate, Reward, Train, OptimizerStep, WeightSync]

# Short names used in traces and plots.
KINDS = {Generate: "generate", Reward: "reward", Train: "train",
         OptimizerStep: "optimizer", WeightSync: "sync"}


T = TypeVar("T")


def by_kind(*, generate: T, reward: T, train: T, optimizer: T, sync: T) -> dict[type, T]:
    """A dispatch table unit type -> handler with every unit kind in it. Each place that
    treats kinds differently (the scheduler's completions, the runtime's calls and results,
    the simulator's durations) builds one, so a new kind cannot be missed in any of them:
    the keyword arguments are required."""
    return {Generate: generate, Reward: reward, Train: train, OptimizerStep: optimizer, WeightSync: sync}


def kind(unit: Unit) -> str:
    return KINDS[type(unit)]


def rows(unit: Union[Generate, Reward, Train], samples_per_group: int) -> tuple[int, int]:
    """[first, last) rows of its micro-batch that `unit` covers (samples_per_group samples per group)."""
    r = getattr(unit, "samples", None)
    return (0, len(unit.groups) * samples_per_group) if r is None else r


def n_samples(unit: Union[Generate, Reward, Train], samples_per_group: int) -> int:
    """Samples `unit` covers: its shard's rows, else the whole micro-batch."""
    r = getattr(unit, "samples", None)
    return len(unit.groups) * samples_per_group if r is None else r[1] - r[0]


def split_rows(n_rows: int, shards: int) -> tuple[Rows, ...]:
    """`n_rows` rows cut into min(shards, n_rows) contiguous ranges of near-equal size (the
    first ones one row longer); (None,) = one shard, the whole micro-batch."""
    k = min(shards, n_rows)
    if k <= 1:
        return (None,)
    q, r = divmod(n_rows, k)
    out, a = [], 0
    for i in range(k):
        b = a + q + (i < r)
        out.append((a, b))
        a = b
    return tuple(out)


def partition(groups_per_step: int, per_micro_batch: int) -> list[tuple[int, ...]]:
    """The groups of each micro-batch of a step: contiguous runs of `per_micro_batch` groups
    (the last one shorter when it does not divide). The runtime and the scheduler both cut
    steps with this, so a micro-batch index means the same samples everywhere."""
    return [tuple(range(i, min(i + per_micro_batch, groups_per_step)))
            for i in range(0, groups_per_step, per_micro_batch)]


class Assignment(NamedTuple):
    """`unit` should start on `worker_id` now. (A tuple: the hot path creates many.)"""

    worker_id: str
    unit: Unit

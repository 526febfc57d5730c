"""The trajectory bytes a run moves to its trainers, by math.payload's rule (the runtime's counter,
`transfer/trajectory_bytes`, counts the same objects' tensors):

    per Train unit   sum over the trainer gang's ranks of the rows each receives (math.payload.
                     train_rows: its share; DPO: the whole unit), each row its kept latents
                     (math.payload.kept_steps of the row's trained steps), their index, its log-probs
    per RL step      sum over the step's Train units

`lean=False` prices the layout before lean trajectories: every rank of the gang received the
unit's rows with every latent x_0 .. x_T (benchmarks/trajectory_bytes.py's "before" column).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Optional

from digenrl.config.contract import contract
from digenrl.math.payload import kept_steps, row_bytes, train_rows
from digenrl.sched.units import split_rows

if TYPE_CHECKING:
    from digenrl.config.schema import Config
    from digenrl.io.trace import Trace


def latent_values(cfg: "Config") -> int:
    """Values of one sample's latent: the tiny DiT's (its base file's channels x size^2), or the
    catalogue's for model.name's family (its first entry) at model.height x width x frames."""
    if cfg.model.name == "tiny-dit":
        from digenrl.models.tiny_dit_weights import check_tiny_dit_file, find_base

        c = check_tiny_dit_file(cfg.model.path or find_base())
        return c.get("channels", 3) * c["image_size"] ** 2  # (TinyDiTConfig's defaults)
    from digenrl.sim.catalogue import Shape, family_models
    from digenrl.sim.catalogue import latent_values as catalogue_values

    m = cfg.model
    return catalogue_values(family_models(m.name)[0], Shape(m.height, m.width, m.frames or 1))


class TrajectoryBytes:
    """Bytes of each Train unit's trajectory rows, for one Config (see the module doc)."""

    def __init__(self, cfg: "Config", values: Optional[int] = None, lean: bool = True):
        from digenrl.train.trainer import step_spec

        self.cfg, self.lean = cfg, lean
        self.values = latent_values(cfg) if values is None else values
        self.shape = contract(cfg).shape
        self.ranks, self.sp = cfg.runtime.trainer.gang, cfg.runtime.trainer.sp
        self._spec = lru_cache(maxsize=4)(lambda step: step_spec(cfg, step)[0])

    def row(self, coord: tuple[int, int, int]) -> int:
        """Bytes of one shipped row (step, group, sample)."""
        from digenrl.rollout.sampler import trained_steps

        spec = self._spec(coord[0])
        reads = spec.reads if self.lean else "all"
        trained = [s for slot in spec.trained_slots for s in trained_steps(spec, [coord], slot)]
        return row_bytes(len(kept_steps(trained, spec.num_steps, reads)), self.values, spec.num_steps, reads)

    def unit(self, unit) -> int:
        """Bytes the ranks of a trainer gang receive for Train unit `unit`."""
        rows = self.shape.samples(tuple(unit.groups))
        if unit.samples is not None:
            rows = rows[unit.samples[0]:unit.samples[1]]
        coords = [(unit.step, g, s) for g, s in rows]
        total = 0
        for r in range(self.ranks):
            if self.lean:
                (a, z), _ = train_rows(len(coords), self.ranks, self.sp, r, self.cfg.train.loss)
            else:
                a, z = 0, len(coords)
            total += sum(self.row(c) for c in coords[a:z])
        return total

    def step(self, step: int) -> int:
        """Bytes of RL step `step`'s Train units: every micro-batch (its train_shard shards) times
        its chunks of trained slots (the scheduler's units, without running it)."""
        from digenrl.train.trainer import step_spec

        c = contract(self.cfg).sched
        slots = len(step_spec(self.cfg, step)[1])
        chunks = -(-slots // c.tsp_chunk) if c.tsp else 1
        total = 0
        for groups in self.shape.micro_batches():
            for rows in split_rows(len(self.shape.samples(groups)), c.train_shard):
                total += chunks * self.unit(_Unit(step, groups, rows))
        return total


class _Unit:
    def __init__(self, step: int, groups, samples):
        self.step, self.groups, self.samples = step, groups, samples


def predict_trajectory_bytes(cfg: "Config", trace: "Trace", values: Optional[int] = None) -> list[int]:
    """Per RL step (index = the unit's step), the `transfer/trajectory_bytes` the runtime counts
    for `cfg` running the schedule in `trace` (spans must carry their unit; lost units dropped)."""
    tb = TrajectoryBytes(cfg, values)
    steps: list[int] = []
    for s in trace.spans:
        if s.kind != "train" or s.unit is None or (s.extra or {}).get("lost"):
            continue
        while len(steps) <= s.unit.step:
            steps.append(0)
        steps[s.unit.step] += tb.unit(s.unit)
    return steps

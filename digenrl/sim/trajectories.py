"""The trajectory bytes a run moves to its trainers, by math.payload's rule (the runtime's counter,
`transfer/trajectory_bytes`, counts the same objects' tensors):

    per Train unit   sum over the trainer gang's ranks of the rows each receives (math.payload.
                     train_rows: its share; DPO: the whole unit), each row the latents of the
                     unit's trained slots (rollout.sampler.row_kept: x_t, x_t+1 of each; x_T for
                     nft / awm / dpo), one step index each, and the row's log-probs
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

    def row(self, coord: tuple[int, int, int], slots) -> int:
        """Bytes a Train unit of trained slots `slots` receives of row (step, group, sample)."""
        from digenrl.rollout.sampler import row_kept

        spec = self._spec(coord[0])
        if not self.lean:
            return row_bytes(spec.num_steps + 1, self.values, spec.num_steps, "all")
        return row_bytes(len(row_kept(spec, coord, slots)), self.values, spec.num_steps, spec.reads)

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
            total += sum(self.row(c, unit.t_steps) for c in coords[a:z])
        return total

    def step(self, step: int) -> int:
        """Bytes of RL step `step`'s Train units: every micro-batch (its train_shard shards) and
        chunk of trained slots (the scheduler's units, without running it)."""
        from digenrl.train.trainer import step_spec

        c = contract(self.cfg).sched
        slots = step_spec(self.cfg, step)[1]
        size = c.tsp_chunk if c.tsp else len(slots)
        chunks = [tuple(slots[i:i + size]) for i in range(0, len(slots), size)]
        total = 0
        for groups in self.shape.micro_batches():
            for rows in split_rows(len(self.shape.samples(groups)), c.train_shard):
                for chunk in chunks:
                    total += self.unit(_Unit(step, groups, rows, chunk))
        return total


class _Unit:
    def __init__(self, step: int, groups, samples, t_steps):
        self.step, self.groups, self.samples, self.t_steps = step, groups, samples, t_steps


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

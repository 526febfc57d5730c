"""SchedConfig: the scheduling mode, the shape of an RL step, and the four switches.

The four mechanisms that remove a disaggregated pipeline's bubbles (docs/design/mechanisms.md):

    gap   GAP, generation-axis pipeline: micro-batches stream to the trainers as soon as they
          are rewarded (still on-policy); a micro-batch's generations may be cut into fragments
          (gen_shard) on different generators, each scored as it finishes (Reward.samples),
          the groups assembled when the last one is in
    tsp   TSP, time-step parallelism: a micro-batch's trained denoising steps are split into
          chunks, each a Train unit on any trainer, whose (sample, step) pairs the learner
          trains in packed passes (learner.passes); one optimizer step per RL step
    tag   TAG, trainer-assisted generation: trainers with nothing to train generate with
          their current weights, and hand a partial trajectory to a rollout worker at a
          denoising-step boundary when training work arrives
    tcss  TCSS, trajectory-consistent stale synchronization: rollout starts the next step's
          groups with the previous weights while trainers finish; every trajectory has one
          policy version, at most one behind the weights that train on it
    bts   BTS, recursive bubble-triggered TAG search (sched/bts.py): under TAG, a trainer in a
          bubble generates only where that shortens the predicted makespan of the step
    one_step_off  not one of the four: verl / mm_grpo's batch-level lag of one step

A mode is a preset of switches; each switch can also be set on its own (None = preset):

    mode           gap   tsp   tag   tcss  one_step_off
    colocated      -     -     -     -     -        every worker generates, then trains
    disagg-sync    -     -     -     -     -        separate pools, no overlap
    one-step-off   -     -     -     -     x        verl / mm_grpo: batch-level, lag 1
    gap            x     -     -     -     -
    gap+tsp        x     x     -     -     -
    gap+tsp+tag    x     x     x     -     -
    digenrl        x     x     x     x     -

Sample-axis sharding (any mode; 1 = off: a unit covers every row of its micro-batch):
`gen_shard` / `train_shard` cut each micro-batch's Generate / Train work into that many
shards of contiguous sample rows (`units.split_rows`), which run on different workers. A
micro-batch keeps one policy version across its Generate shards, its Reward waits for all of
them, and exactly-once holds per (step, group, sample, trained step).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Optional, Sequence, Union

MODES = ("colocated", "disagg-sync", "one-step-off", "gap", "gap+tsp", "gap+tsp+tag", "digenrl")
SWITCHES = ("gap", "tsp", "tag", "tcss", "one_step_off", "bts")

_PRESETS = {
    "colocated": (),
    "disagg-sync": (),
    "one-step-off": ("one_step_off",),
    "gap": ("gap",),
    "gap+tsp": ("gap", "tsp"),
    "gap+tsp+tag": ("gap", "tsp", "tag"),
    "digenrl": ("gap", "tsp", "tag", "bts"),  # on-policy; TCSS is opt-in (tcss=True, run.tcss_fraction)
}

# Modes whose Train units wait for the whole step to be rewarded (no GAP streaming): their
# advantages may span the step and their micro-batches may cut prompt groups.
BATCH_MODES = tuple(m for m in MODES if "gap" not in _PRESETS[m])
GAP_MODES = tuple(m for m in MODES if "gap" in _PRESETS[m])  # training streams behind generation
TSP_MODES = tuple(m for m in MODES if "tsp" in _PRESETS[m])
TAG_MODES = tuple(m for m in MODES if "tag" in _PRESETS[m])  # trainers generate: no rollout pool needed

TrainedSteps = Union[Sequence[int], Callable[[int], Sequence[int]], None]


@dataclass
class SchedConfig:
    """What one RL run looks like to the scheduler.

    rl_steps            number of RL (optimizer) steps
    first_step          the RL step the run starts at (a resumed run: its checkpoint's step).
                        Units carry RL steps and versions: steps first_step ..
                        first_step + rl_steps - 1, versions from first_step (step s is
                        trained by version s), so nobody converts between two numberings
    groups_per_step     prompt groups per RL step
    samples_per_group   samples per scheduler group: data.group_size, or 1 when
                        data.micro_batch_samples cuts prompt groups into samples (the row
                        count of sample shards; not the GRPO group, which is data.group_size)
    num_steps           denoising steps per trajectory
    trained_steps       trained denoising-step indices (the SDE window): a fixed sequence,
                        a function step -> sequence, or None = all but the last (Flow-GRPO)
    micro_batch_groups  groups per micro-batch: the generation batch and the GAP unit
    tsp_chunk           trained denoising steps per Train unit when tsp is on
    tag_segment         denoising steps per Generate segment a trainer runs under TAG
    rollout_segment     denoising steps per Generate segment on rollout workers; None =
                        the whole remaining trajectory in one unit (fewest events). Shorter
                        segments make a lost worker's restart point later.
    gen_shard           Generate shards per micro-batch (sample axis; 1 = off). A shard is
                        rows [first, last) of the micro-batch (Generate.samples); shards of
                        one micro-batch start with the version of its first shard and may run
                        on several workers at once; Reward waits for all of them. Capped at
                        the micro-batch's sample count.
    train_shard         Train units per (micro-batch, TSP chunk) along the sample axis (1 =
                        off): Train(mb, samples=[first, last), t_steps) units, so one micro-
                        batch's training spreads over several trainers (tail of a step).
    gap/tsp/tag/tcss/one_step_off   switches; None = the mode's preset
    """

    mode: str = "digenrl"
    rl_steps: int = 1
    groups_per_step: int = 8
    samples_per_group: int = 8
    num_steps: int = 10
    trained_steps: TrainedSteps = None
    micro_batch_groups: int = 1
    tsp_chunk: int = 1
    tag_segment: int = 1
    rollout_segment: Optional[int] = None
    gen_shard: int = 1
    train_shard: int = 1
    gap: Optional[bool] = None
    tsp: Optional[bool] = None
    tag: Optional[bool] = None
    tcss: Optional[bool] = None
    one_step_off: Optional[bool] = None
    bts: Optional[bool] = None
    # TCSS's cap: at most this fraction of a step's micro-batches (rounded up) start with the
    # previous version while the trainers finish the step before (1 = any number)
    tcss_fraction: float = 1.0
    # TAG: a trainer with training work ready at a segment boundary hands its partial trajectory
    # to a rollout worker (True), or finishes it first (False)
    tag_handback: bool = True
    first_step: int = 0  # the RL step the run starts at (see above)

    def __post_init__(self):
        if self.mode == "local":
            raise ValueError("SchedConfig.mode='local' runs without a scheduler "
                             "(single-device trainer); pick one of: " + ", ".join(MODES))
        if self.mode not in MODES:
            raise ValueError(f"SchedConfig.mode={self.mode!r} is not one of: {', '.join(MODES)}")
        for key in ("rl_steps", "groups_per_step", "samples_per_group", "num_steps",
                    "micro_batch_groups", "tsp_chunk", "tag_segment", "gen_shard", "train_shard"):
            _positive_int(key, getattr(self, key))
        if self.rollout_segment is not None:
            _positive_int("rollout_segment", self.rollout_segment)
        if not isinstance(self.first_step, int) or isinstance(self.first_step, bool) or self.first_step < 0:
            raise ValueError(f"SchedConfig.first_step={self.first_step!r}: allowed values are integers >= 0")
        preset = _PRESETS[self.mode]
        if self.bts is None and self.tag is False:  # BTS decides TAG's bubbles: off with TAG
            self.bts = False
        for key in SWITCHES:
            value = getattr(self, key)
            if value is None:
                setattr(self, key, key in preset)
            elif not isinstance(value, bool):
                raise ValueError(f"SchedConfig.{key}={value!r}: "
                                 "allowed values are True, False, None")
        if self.mode == "colocated":
            for key in ("gap", "tag", "tcss", "one_step_off"):
                if getattr(self, key):
                    raise ValueError(f"SchedConfig.{key}=True is not allowed with mode='colocated' "
                                     "(one pool: generation and training cannot overlap); "
                                     "allowed: False")
        if not 0.0 < self.tcss_fraction <= 1.0:
            raise ValueError(f"SchedConfig.tcss_fraction={self.tcss_fraction!r}: allowed values are in (0, 1]")
        if self.bts and not self.tag:
            raise ValueError("SchedConfig.bts=True decides when trainers generate: it needs tag=True")
        if self.tcss and self.one_step_off:
            raise ValueError("SchedConfig.tcss and SchedConfig.one_step_off are exclusive "
                             "(both bound staleness to one version); set one of them to False")
        if self.trained_steps is not None and not callable(self.trained_steps):
            self.trained_steps = self._check_steps(self.trained_steps, where="trained_steps")

    # Derived policy knobs: the scheduler reads these, not the mode string.
    @property
    def colocated(self) -> bool:
        return self.mode == "colocated"

    @property
    def lag(self) -> int:
        """Max versions a trajectory may trail the trainer that trains it (0 = on-policy)."""
        return 1 if (self.tcss or self.one_step_off) else 0

    @property
    def num_micro_batches(self) -> int:
        return -(-self.groups_per_step // self.micro_batch_groups)

    def trained(self, step: int) -> tuple[int, ...]:
        """Trained denoising-step indices of RL step `step` (sorted, unique)."""
        ts = self.trained_steps
        if ts is None:
            return tuple(range(max(self.num_steps - 1, 1)))
        if callable(ts):
            return self._check_steps(ts(step), where=f"trained_steps({step})")
        return ts

    def _check_steps(self, steps: Sequence[int], where: str) -> tuple[int, ...]:
        out = tuple(sorted({int(t) for t in steps}))
        if not out or out[0] < 0 or out[-1] >= self.num_steps:
            raise ValueError(f"SchedConfig.{where}={tuple(steps)!r}: need a non-empty set of "
                             f"denoising-step indices in [0, num_steps={self.num_steps})")
        return out

    @property
    def end_step(self) -> int:
        """One past the last RL step: the version the run ends at."""
        return self.first_step + self.rl_steps

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "trained_steps"}


def _positive_int(key: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"SchedConfig.{key}={value!r}: allowed values are integers >= 1")

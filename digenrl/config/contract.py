"""One contract from plan to run: what a Config asks the scheduler and the pools to do.

    digenrl plan --writes--> config YAML --load_config--> Config
                                                            |
                                                       contract(cfg)
                                                            v
                              RunContract(sched: SchedConfig, pools: PoolSpec per role)
                   +------------------------+------------------------+
                   v                        v                        v
          RayDriver (real compute)   emulated runtime          simulator
          one actor per worker,       sleeping actors,          virtual clock,
          the Config's models         cost-model durations      cost-model durations

Every knob that shapes the schedule is read here and nowhere else: the mode, the pools,
the step's data shape (prompt groups, samples, micro-batches), the TSP chunk, TAG and
rollout segments, sample shards. So a config the planner writes runs unchanged on the
runtime, and the runtime runs exactly the schedule the simulator predicted for it.

Scheduler groups. The scheduler cuts a step into micro-batches of whole *scheduler
groups*. Normally a scheduler group is a prompt group (data.group_size samples). With
data.micro_batch_samples > 0 (batch-level modes: nothing trains before the whole step is
rewarded) a scheduler group is one sample, so micro-batches may cut prompt groups, as
flow_grpo spreads a group's samples over GPUs. `StepShape` maps between the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from digenrl.config.runtime import PoolConfig
from digenrl.config.schema import Config
from digenrl.sched import TSP_MODES, SchedConfig, Worker, partition


@dataclass(frozen=True)
class StepShape:
    """How an RL step's samples map onto scheduler groups and micro-batches."""

    groups_per_step: int  # scheduler groups per RL step
    samples_per_group: int  # samples per scheduler group
    micro_batch_groups: int  # scheduler groups per micro-batch
    group_size: int  # samples per prompt group (the GRPO group)
    pairs_per_pass: int = 0  # train.pairs_per_pass: (sample, trained step) pairs per packed pass (0: per step)

    def micro_batches(self) -> list[tuple[int, ...]]:
        """Scheduler groups of each micro-batch, in order."""
        return partition(self.groups_per_step, self.micro_batch_groups)

    def samples(self, groups: tuple[int, ...]) -> list[tuple[int, int]]:
        """(prompt group, sample within it) of each row of a micro-batch, in row order."""
        k = self.samples_per_group
        return [divmod(g * k + r, self.group_size) for g in groups for r in range(k)]


def step_shape(cfg: Config) -> StepShape:
    d = cfg.data
    if d.micro_batch_samples:
        return StepShape(d.groups_per_step * d.group_size, 1, d.micro_batch_samples, d.group_size,
                         cfg.train.pairs_per_pass)
    return StepShape(d.groups_per_step, d.group_size, d.micro_batch_groups, d.group_size, cfg.train.pairs_per_pass)


def trained_steps(cfg: Config, step: int) -> list[int]:
    """Trained denoising-step indices of RL step `step` (the SDE window)."""
    s = cfg.sampling
    return s.sde_window().select(s.num_steps, cfg.run.seed, step)[1]


def tsp_chunk(cfg: Config, n_trained: int) -> int:
    """Trained steps per Train unit: train.tsp_chunk, or the mode's default when 0 (1 under
    TSP, else every trained step in one unit). The same in every mode, local included."""
    if cfg.train.tsp_chunk:
        return cfg.train.tsp_chunk
    return 1 if cfg.run.mode in TSP_MODES else n_trained


@dataclass(frozen=True)
class PoolSpec:
    """One pool of scheduler workers: its role, size and what each worker reserves."""

    role: str  # rollout | trainer | colocated | reward
    workers: int
    resources: PoolConfig


@dataclass(frozen=True)
class RunContract:
    sched: SchedConfig
    pools: tuple[PoolSpec, ...]
    shape: StepShape

    def workers(self) -> list[Worker]:
        """One scheduler worker per pool member, named `<role>-<i>` (runtime, emulated, sim)."""
        return [Worker(f"{p.role}-{i}", p.role) for p in self.pools for i in range(p.workers)]

    def pool(self, role: str) -> Optional[PoolSpec]:
        return next((p for p in self.pools if p.role == role), None)

    def describe(self) -> str:
        """What `digenrl train` prints before it starts: the plan it runs."""
        c, sh = self.sched, self.shape
        pools = " + ".join(f"{p.workers} {p.role}" for p in self.pools if p.workers)
        mb = (f"{sh.micro_batch_groups} samples" if sh.samples_per_group == 1 and sh.group_size > 1
              else f"{sh.micro_batch_groups} groups")
        knobs = [f"micro-batch {mb}", f"tsp_chunk {c.tsp_chunk if c.tsp else 'all'}"]
        if c.tag:
            knobs.append(f"tag_segment {c.tag_segment}")
        if c.gen_shard > 1 or c.train_shard > 1:
            knobs.append(f"shards gen {c.gen_shard} / train {c.train_shard}")
        return f"{c.mode}: {pools}; " + ", ".join(knobs)


def pools(cfg: Config) -> tuple[PoolSpec, ...]:
    """The worker pools of a Ray run. Colocated: every device of both pools generates and
    trains (one pool, sized rollout.workers + trainer.workers, reserving as a trainer)."""
    rt = cfg.runtime
    if cfg.run.mode == "colocated":
        policy = (PoolSpec("colocated", rt.rollout.workers + rt.trainer.workers, rt.trainer),)
    else:
        policy = (PoolSpec("trainer", rt.trainer.workers, rt.trainer),
                  PoolSpec("rollout", rt.rollout.workers, rt.rollout))
    return policy + (PoolSpec("reward", rt.reward.workers, rt.reward),)


def contract(cfg: Config, *, start_step: int = 0,
             trained: Optional[Callable[[int], list[int]]] = None) -> RunContract:
    """The scheduler config and pools of `cfg`, for steps start_step .. train.steps - 1.

    The scheduler's units carry RL steps and versions from start_step (a resumed run's
    checkpoint step), so no caller converts between numberings. `trained(step)` overrides
    the trained denoising steps of RL step `step` (default: the config's SDE window).
    run.mode=local has no scheduler: the SchedConfig built here refuses it, naming the modes.
    """
    rt, sh = cfg.runtime, step_shape(cfg)
    window = trained or (lambda step: trained_steps(cfg, step))
    n_trained = len(window(start_step))
    sched = SchedConfig(
        mode=cfg.run.mode, rl_steps=cfg.train.steps - start_step, first_step=start_step,
        groups_per_step=sh.groups_per_step, samples_per_group=sh.samples_per_group,
        num_steps=cfg.sampling.num_steps,
        trained_steps=window,
        micro_batch_groups=sh.micro_batch_groups,
        # An explicit chunk acts in every mode (batch-level: an even data-parallel share);
        # 0 leaves the mode's preset.
        tsp=True if cfg.train.tsp_chunk else None,
        tsp_chunk=tsp_chunk(cfg, n_trained),
        tcss=True if cfg.run.tcss_fraction > 0 else None, tcss_fraction=cfg.run.tcss_fraction or 1.0,
        tag_segment=rt.tag_segment, tag_handback=rt.tag_handback, rollout_segment=rt.rollout_segment or None,
        gen_shard=rt.gen_shard, train_shard=rt.train_shard)
    return RunContract(sched, pools(cfg), sh)

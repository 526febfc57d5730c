"""The simulator's trajectory bytes (sim.trajectories) are the bytes a toy run's Train unit receives:
the tiny DiT generates a micro-batch, a rollout worker ships it row by row (rollout.sampler.ship_rows),
each rank of a gang of 2 takes its rows (math.payload.train_rows), and the tensors' bytes are counted
(rollout.sampler.payload_bytes), as TrainerRank.train counts them."""

from __future__ import annotations

import pytest
import torch

from digenrl.config.schema import load_config
from digenrl.math.payload import train_rows
from digenrl.models import build_policy
from digenrl.rollout import advance, finish, payload_bytes, ship_rows, start
from digenrl.sched import Train
from digenrl.sim.trajectories import TrajectoryBytes
from digenrl.train.trainer import plan_step, prompt_source

TOY = ["data.groups_per_step=2", "data.group_size=3", "data.micro_batch_groups=2", "sampling.num_steps=4",
       "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp", "runtime.trainer.workers=1",
       "model.lora_rank=0"]  # (no adapters: the policy builds without importing peft)


@pytest.mark.parametrize("extra", [
    ["sampling.window=contiguous", "sampling.window_size=2"],
    ["sampling.window=fraction", "sampling.window_fraction=0.5", "sampling.window_draw=sample",
     "sampling.sde=dance-sde"],
    ["train.loss=nft", "sampling.sde=ode"],
], ids=["window", "per-sample", "nft"])
def test_counted_bytes_of_a_unit_are_the_simulated_bytes(extra):
    cfg = load_config(None, TOY + extra)
    plan = plan_step(cfg, prompt_source(cfg), 1)
    mb = plan.micro_batches[0]
    policy = build_policy(cfg.model, progress=False)
    torch.manual_seed(0)
    traj = finish(policy, advance(policy, start(policy, mb.prompts, mb.coords, plan.spec, step=1, version=0),
                                  plan.spec))
    rows = ship_rows(traj, plan.spec)
    assert all(r.images is None for r in rows)  # the media go to the reward, not to the trainers
    unit = Train(step=1, mb=0, groups=mb.groups, t_steps=tuple(plan.chunks[0]), traj_version=0)
    counted = 0
    for rank in range(2):
        (a, z), _ = train_rows(len(rows), 2, 1, rank, cfg.train.loss)
        counted += sum(payload_bytes(r) for r in rows[a:z])
    sim = TrajectoryBytes(cfg)
    assert counted == sim.unit(unit)
    before = TrajectoryBytes(cfg, lean=False).unit(unit)
    assert before == 2 * len(rows) * payload_bytes(traj) // len(rows)  # every rank, every latent
    assert counted < before

"""The simulator's trajectory bytes (sim.trajectories) are the bytes a toy run's Train unit receives:
the tiny DiT generates a micro-batch, a rollout worker ships it row by row (rollout.sampler.ship_rows),
each rank of a gang of 2 takes its rows (math.payload.train_rows) and their latents of the unit's
slots, and the tensors' bytes are counted (rollout.sampler.received_bytes), as TrainerRank.train
counts them."""

from __future__ import annotations

import pytest
import torch

from digenrl.config.schema import load_config
from digenrl.math.payload import train_rows
from digenrl.models import build_policy
from digenrl.rollout import advance, finish, payload_bytes, received_bytes, row_kept, ship_rows, start
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
    heads, flat = ship_rows(traj, plan.spec)
    assert all(h.images is None for h in heads)  # the media go to the reward, not to the trainers
    it = iter(flat)
    latent = {(i, s): next(it) for i, c in enumerate(mb.coords) for s in row_kept(plan.spec, c)}
    sim, before = TrajectoryBytes(cfg), TrajectoryBytes(cfg, lean=False)
    for chunk in plan.chunks:  # each Train unit (TSP: one per trained slot)
        unit = Train(step=1, mb=0, groups=mb.groups, t_steps=tuple(chunk), traj_version=0)
        counted = 0
        for rank in range(2):  # what RealBackend._call_train hands each rank of the gang
            (a, z), _ = train_rows(len(heads), 2, 1, rank, cfg.train.loss)
            lats = [latent[(i, s)] for i in range(a, z) for s in row_kept(plan.spec, mb.coords[i], chunk)]
            counted += received_bytes(heads[a:z], lats)
        assert counted == sim.unit(unit)
        assert before.unit(unit) == 2 * payload_bytes(traj)  # every rank, every row, every latent
        assert counted < before.unit(unit)

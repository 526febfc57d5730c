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


# The simulator's clock charges the bytes the runtime counts: every Train unit's pull
# (DurationFn.traj_bytes, durations._train_traj) summed per RL step equals sim.trajectories'
# prediction from the same trace, which the test above ties to the runtime's counter.
@pytest.mark.parametrize("bed,spec", [
    ({}, dict(mode="digenrl", n_rollout=8)),
    ({}, dict(mode="digenrl", n_rollout=8, gang=4, tsp_chunk=2, train_shard=2)),
    ({"trained_steps": 3}, dict(mode="gap+tsp", n_rollout=4, gang=2, tsp_chunk=3)),  # all-but-last
    ({"old_forward": True}, dict(mode="digenrl", n_rollout=8, gang=2)),  # nft: x_T only
    ({"pair_rows": 2, "kl": True}, dict(mode="digenrl", n_rollout=8, gang=4)),  # dpo: every rank the whole unit
    ({}, dict(mode="colocated", micro_batch_groups=2)),  # run.mode=colocated: the runtime's own rows
], ids=["digenrl", "gang-4-chunks", "all-but-last", "nft", "dpo", "colocated"])
def test_the_simulator_charges_the_counted_bytes(bed, spec):
    from dataclasses import replace

    from digenrl.sched import Scheduler
    from digenrl.sim.costs import CostModel
    from digenrl.sim.engine import run_virtual
    from digenrl.sim.testbed import load_testbed
    from digenrl.sim.trajectories import predict_trajectory_bytes
    from digenrl.sim.workload import RunSpec, config_for, duration_fn
    from digenrl.config.contract import contract

    tb = replace(load_testbed("small-h200x16-sd35"), **bed)
    cfg = config_for(tb, RunSpec(**spec), 3)
    fn = duration_fn(cfg, tb, CostModel())
    trace = run_virtual(Scheduler(contract(cfg).sched, fn.layout.workers), fn)
    want = predict_trajectory_bytes(cfg, trace)
    assert sum(want) > 0 and [fn.traj_bytes.get(s, 0) for s in range(len(want))] == want
    assert fn.overhead_ws["trajectory_pull"] > 0


def test_the_testbed_keys_of_a_trajectory_act_or_are_refused():
    from dataclasses import replace

    from digenrl.config.errors import ConfigError
    from digenrl.sim.costs import CostModel
    from digenrl.sim.testbed import TestbedError, load_testbed
    from digenrl.sim.workload import RunSpec, config_for, duration_fn

    tb = load_testbed("small-h200x16-sd35", trained_steps=3)  # all-but-last: a per-sample draw may train it
    with pytest.raises(TestbedError, match="key 'trajectory_reads'"):
        replace(tb, trajectory_reads="some")
    with pytest.raises(TestbedError, match="key 'window_draw'"):
        replace(tb, window_draw="often")
    # a testbed whose reads its objective's flags do not imply is refused where a plan writes its Config
    with pytest.raises(ConfigError, match="trajectory_reads"):
        config_for(replace(tb, trajectory_reads="final"), RunSpec("digenrl", n_rollout=8), 2)
    drawn = replace(tb, window_draw="sample")
    spec = RunSpec("digenrl", n_rollout=8, tsp_chunk=2)
    cfg = config_for(drawn, spec, 2)
    assert cfg.sampling.window_draw == "sample"  # the plan's Config draws per sample, as priced
    # a unit of 2 slots: each row's own 2 of the 3 SDE steps ship the mean count of latents
    # (2k - k(k-1)/levels), 2 steps in place ship x_0, x_1, x_2
    fn, fixed = duration_fn(cfg, drawn, CostModel()), duration_fn(config_for(tb, spec, 2), tb, CostModel())
    assert fn._columns((0, 1)) == pytest.approx(2 * 2 - 2 * 1 / 3)
    assert fixed._columns((0, 1)) == 3

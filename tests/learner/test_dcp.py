"""Sharded checkpoints (torch.distributed.checkpoint): a 2-rank FSDP gang saves, one
unsharded process loads and continues.

    2 ranks (gloo, FSDP2): step 1 on half the rows each -> save_sharded_checkpoint
                           -> gather full weights, AdamW moments, EMA -> step 2
    1 process, no group:   load_checkpoint(step_dir) -> (a) equals the gathered state
                           -> step 2 on all rows   -> (b) allclose to the gang's step 2
    and 1 -> 2:            a one-process save_sharded, loaded by the gang into its shards

(a) is exact: DCP moves the saved bytes, it computes nothing. (b) differs from the gang
only by summation order (FSDP's reduce-scatter of the two halves' gradients).
"""

from __future__ import annotations

import dataclasses
import os
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from digenrl.io import checkpoint as ckpt
from digenrl.learner import Learner
from digenrl.learner.sharded import full_tensors
from digenrl.models.lora import trainable_state_dict
from tests.helpers.ranks import spawn_ranks
from tests.learner.tiny_setup import CONFIG as _BASE
from tests.learner.tiny_setup import SPEC, T_STEPS, WORLD, four_sample_batch, rows_of, tiny_policy

CONFIG = dataclasses.replace(_BASE, ema_decay=0.5)  # EMA on: its shadows are checkpointed too


def _moments(learner: Learner, names: dict) -> dict[str, torch.Tensor]:
    """AdamW state by "<parameter name>.<slot>", whole CPU tensors (gathered when sharded)."""
    return full_tensors({f"{name}.{slot}": v for name, p in names.items()
                         for slot, v in learner.optimizer.state[p].items()})


def _snapshot(learner: Learner) -> dict:
    module = learner.policy.module
    names = {n: p for n, p in module.named_parameters() if p.requires_grad}
    return {"weights": full_tensors(trainable_state_dict(module)), "moments": _moments(learner, names),
            "ema": full_tensors(learner.ema.shadow)}


def _gang(rank: int, tmp: str, lora_rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner.sharded import shard_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
        policy = shard_policy(tiny_policy(2, lora_rank), mesh)
        learner = Learner(policy, CONFIG)
        traj = torch.load(f"{tmp}/batch.pt", weights_only=False)
        half = len(traj) // WORLD
        mine = rows_of(traj, slice(rank * half, (rank + 1) * half))

        def step() -> None:
            learner.accumulate(mine, T_STEPS, SPEC, total_samples=len(traj), total_steps=len(T_STEPS))
            learner.optimizer_step()

        step()
        ckpt.save_sharded_checkpoint(Path(tmp) / "run", 1, module=policy.module, optimizer=learner.optimizer,
                                     ema=learner.ema, state={"step": 1}, keep=2, group=mesh.get_group())
        saved = _snapshot(learner)
        step()
        after = full_tensors(trainable_state_dict(policy.module))
        # the other direction, 1 -> 2: a one-process checkpoint resharded onto this gang
        ckpt.load_sharded(Path(tmp) / "single", policy.module, learner.optimizer, learner.ema, mesh.get_group())
        from_single = _snapshot(learner)
        if rank == 0:
            torch.save({"saved": saved, "after": after, "from_single": from_single}, f"{tmp}/gang.pt")
        dist.barrier()  # no rank tears gloo down while another still talks to it (SIGABRT at exit)
    finally:
        dist.destroy_process_group()
    # success: leave without interpreter teardown, where gloo's threads aborted a rank
    # ('terminate called without an active exception') on clean CI clones
    os._exit(0)


@pytest.mark.parametrize("lora_rank", [pytest.param(0, marks=pytest.mark.slow), 4], ids=["full", "lora"])
def test_gang_checkpoint_loads_unsharded_and_continues(tmp_path, lora_rank):
    traj = four_sample_batch(tiny_policy(2, lora_rank))
    torch.save(traj, tmp_path / "batch.pt")
    single = Learner(tiny_policy(2, lora_rank), CONFIG)  # one process, no group: a step, then dcp/ of one "rank"
    single.accumulate(traj, T_STEPS, SPEC, total_samples=len(traj), total_steps=len(T_STEPS))
    single.optimizer_step()
    ckpt.save_sharded(tmp_path / "single", single.policy.module, single.optimizer, single.ema)
    spawn_ranks(_gang, (str(tmp_path), lora_rank), WORLD)
    gang = torch.load(tmp_path / "gang.pt", weights_only=False)

    step_dir = ckpt.latest_checkpoint(tmp_path / "run")
    assert step_dir is not None and step_dir.name == "step_000001" and ckpt.is_sharded(step_dir)
    files = sorted(p.name for p in (step_dir / "dcp").iterdir())
    assert all(f.endswith((".safetensors", ".json")) for f in files), files  # no pickled .metadata / .distcp
    assert not (step_dir / "policy.safetensors").exists()
    # each rank hashed its own shard while writing it; rank 0 merged both into the manifest
    import xxhash

    manifest = json.loads((step_dir / ckpt.MANIFEST).read_text())["files"]
    assert sorted(manifest) == [f"dcp/{f}" for f in files] and len(files) == WORLD + 1  # + optimizer.json
    for rel, entry in manifest.items():
        assert entry["xxh3_128"] == xxhash.xxh3_128((step_dir / rel).read_bytes()).hexdigest(), rel

    # (a) one process, no process group: the gathered state, bit for bit
    policy = tiny_policy(2, lora_rank)
    learner = Learner(policy, CONFIG)
    untrained = full_tensors(trainable_state_dict(policy.module))
    state = ckpt.load_checkpoint(step_dir, policy.module, learner.optimizer, learner.ema)
    assert state == {"step": 1}
    got = _snapshot(learner)
    for part in ("weights", "moments", "ema"):
        want = gang["saved"][part]
        assert got[part].keys() == want.keys(), part
        for k, w in want.items():
            assert torch.equal(got[part][k], w), f"{part} {k}"
    slots = {k.rsplit(".", 1)[1] for k in got["moments"]}
    assert slots == {"step", "exp_avg", "exp_avg_sq"}
    # not vacuous: the checkpoint is not the freshly built model, and the moments are live
    assert any(not torch.equal(untrained[k], w) for k, w in got["weights"].items())
    assert all(float(v) == 1.0 for k, v in got["moments"].items() if k.endswith(".step"))
    if lora_rank:
        assert all("lora_" in k for k in got["weights"])

    # 1 -> 2: the gang read the one-process checkpoint into its shards, bit for bit
    from_single = _snapshot(single)
    for part in ("weights", "moments", "ema"):
        assert gang["from_single"][part].keys() == from_single[part].keys(), part
        for k, w in from_single[part].items():
            assert torch.equal(gang["from_single"][part][k], w), f"1 -> 2: {part} {k}"

    # (b) one more step on all rows from the loaded state == the gang's step 2
    learner.accumulate(traj, T_STEPS, SPEC, total_samples=len(traj), total_steps=len(T_STEPS))
    learner.optimizer_step()
    after = trainable_state_dict(policy.module)
    change = max((gang["after"][k] - w).abs().max().item() for k, w in gang["saved"]["weights"].items())
    assert change > 0.5 * CONFIG.lr
    for k, w in gang["after"].items():
        torch.testing.assert_close(after[k], w, rtol=1e-5, atol=1e-5, msg=lambda m, k=k: f"weight {k}: {m}")


def test_optimizer_groups_are_json(tmp_path):
    # the only non-tensor state, AdamW's hyperparameters, round-trips through JSON; one
    # process with no process group saves the sharded layout too
    policy = tiny_policy(2, 0)
    learner = Learner(policy, dataclasses.replace(CONFIG, lr=3e-4))
    with pytest.raises(ValueError, match="before the first optimizer step"):
        ckpt.save_sharded(tmp_path, policy.module, learner.optimizer, learner.ema)
    for p in learner.params:
        p.grad = torch.ones_like(p)
    learner.optimizer_step()
    ckpt.save_sharded(tmp_path, policy.module, learner.optimizer, learner.ema)
    groups = json.loads((tmp_path / "dcp" / "optimizer.json").read_text())
    assert groups[0]["lr"] == 3e-4 and "blocks.0.qkv.weight" in groups[0]["params"]
    other = Learner(tiny_policy(2, 0), CONFIG)
    ckpt.load_sharded(tmp_path, other.policy.module, other.optimizer, other.ema)
    assert other.optimizer.param_groups[0]["lr"] == 3e-4
    assert other.optimizer.param_groups[0]["betas"] == CONFIG.betas
    assert isinstance(other.optimizer.param_groups[0]["betas"], tuple)


# -- (c) the local Trainer resumes from a gang's checkpoint ------------------------------
def _gang_trainer(rank: int, tmp: str, overrides: list[str]) -> None:
    """Step 0 of `Trainer.rl_step` by a 2-rank FSDP gang, then the sharded checkpoint.

    Every rank generates and rewards the whole step (same counter-based noise); each
    trains its half of every micro-batch's rows, weighted by the global batch.
    """
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.config.schema import load_config
    from digenrl.learner.sharded import shard_policy
    from digenrl.runtime.shards import select_rows
    from digenrl.train.trainer import Trainer, assign_advantages, plan_step
    from digenrl.rollout import generate

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
        trainer = Trainer(load_config(None, overrides), progress=False)
        shard_policy(trainer.policy, mesh)
        learner = trainer.learner = Learner(trainer.policy, trainer.learner.config)  # over the shards
        plan = plan_step(trainer.cfg, trainer.source, 0)
        trajs = []
        for mb in plan.micro_batches:
            traj = generate(trainer.policy, mb.prompts, mb.coords, plan.spec, step=0, version=0)
            traj.rewards, traj.reward_parts = trainer.rewarder.score(traj.images, traj.prompts, traj.group_ids)
            trajs.append(traj)
        assign_advantages(trajs, trainer.cfg)
        for traj in trajs:
            half = len(traj) // WORLD
            mine = select_rows(traj, rank * half, (rank + 1) * half)
            for chunk in plan.chunks:
                learner.accumulate(mine, chunk, plan.spec, total_samples=plan.samples,
                                   total_steps=len(plan.trained_steps))
        learner.optimizer_step()
        trainer.step = 1
        ckpt.save_sharded_checkpoint(trainer.run_dir, 1, module=trainer.policy.module, optimizer=learner.optimizer,
                                     ema=learner.ema, state=trainer.checkpoint_state(), keep=2,
                                     group=mesh.get_group())
        trainer.rewarder.close()
        dist.barrier()  # no rank tears gloo down while another still talks to it (SIGABRT at exit)
    finally:
        dist.destroy_process_group()
    # success: leave without interpreter teardown, where gloo's threads aborted a rank
    # ('terminate called without an active exception') on clean CI clones
    os._exit(0)


# ~50 s each on 2 cores; LoRA's loads are covered in the default tier by the tests above
@pytest.mark.parametrize("lora_rank", [pytest.param(0, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)],
                         ids=["full", "lora"])
def test_local_trainer_resumes_from_gang_checkpoint(tiny_overrides, tmp_path, lora_rank):
    # Must-show "a lost trainer rank": --resume on another gang size (2 -> 1 here)
    # reaches the weights of an uninterrupted run
    from safetensors.torch import load_file

    from digenrl.config.schema import load_config
    from digenrl.train.trainer import Trainer

    base = tiny_overrides + [f"model.lora_rank={lora_rank}", "train.steps=2", "run.checkpoint_every=1",
                             "run.eval_every=0", "train.ema_decay=0.9"]

    def overrides(run: str) -> list[str]:
        return [o.replace(str(tmp_path / "run"), str(tmp_path / run)) for o in base]

    Trainer(load_config(None, overrides("whole")), progress=False).train()  # 2 steps, one process
    spawn_ranks(_gang_trainer, (str(tmp_path), overrides("gang")), WORLD)
    assert ckpt.is_sharded(tmp_path / "gang" / "checkpoints" / "step_000001")
    resumed = Trainer(load_config(None, overrides("gang")), progress=False)
    resumed.train(resume=True)  # step 1 only, from the gang's step 0
    assert resumed.step == 2

    want = load_file(str(tmp_path / "whole" / "final" / "policy.safetensors"))
    got = load_file(str(tmp_path / "gang" / "final" / "policy.safetensors"))
    start = trainable_state_dict(_fresh(overrides("fresh")))
    assert got.keys() == want.keys() == start.keys()
    change = max((want[k] - start[k]).abs().max().item() for k in want)
    assert change > 1e-4  # two steps moved the weights
    for k in want:  # FSDP's summation order only: the bound, 1% of the run's largest change
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-2 * change, msg=lambda m, k=k: f"{k}: {m}")
    ema_want = load_file(str(tmp_path / "whole" / "final" / "ema.safetensors"))
    ema_got = load_file(str(tmp_path / "gang" / "final" / "ema.safetensors"))
    for k in ema_want:
        torch.testing.assert_close(ema_got[k], ema_want[k], rtol=0, atol=1e-2 * change)


def _fresh(overrides: list[str]) -> torch.nn.Module:
    from digenrl.config.schema import load_config
    from digenrl.models import build_policy

    return build_policy(load_config(None, overrides).model, progress=False).module

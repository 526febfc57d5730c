"""FSDP2-sharded Learner over 2 CPU processes (gloo) == single-device Learner on the whole batch.

Each rank trains a disjoint half of one RL step's batch with the unchanged `Learner`
(`total_samples` = the global batch), then steps. The gathered gradient, the gradient
norm and the weights after the step must equal the single-device run's. The gradient and
its norm are compared as well as the weights because AdamW's first step is nearly
invariant to the gradient's scale: a mean over ranks instead of a sum would still give
the same weights.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.rollout import SampleSpec, advance, start
from digenrl.models.lora import trainable_state_dict
from tests.helpers.ranks import spawn_ranks
from tests.learner.tiny_setup import ADVANTAGES, CONFIG, SPEC, T_STEPS, WORLD, four_sample_batch, rows_of, tiny_policy


def _single_device(lora_rank: int) -> dict:
    policy = tiny_policy(2, lora_rank)
    traj = four_sample_batch(policy)
    learner = Learner(policy, CONFIG)
    before = {k: v.clone() for k, v in trainable_state_dict(policy.module).items()}
    learner.accumulate(traj, T_STEPS, SPEC, total_samples=len(traj), total_steps=len(T_STEPS))
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.requires_grad}
    metrics = learner.optimizer_step()
    return {"before": before, "grads": grads, "metrics": metrics, "after": trainable_state_dict(policy.module)}


def _worker(rank: int, tmp: str, lora_rank: int, mesh_shape: tuple[int, ...], reshard: bool, bf16: bool) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner.sharded import full_state_dict, shard_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        names = ("replicate", "shard")[-len(mesh_shape):]
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        policy = tiny_policy(2, lora_rank)
        traj = torch.load(f"{tmp}/batch.pt", weights_only=False)  # the single-device run's batch
        shard_policy(policy, mesh, reshard_after_forward=reshard, mixed_precision=bf16)
        learner = Learner(policy, CONFIG)
        half = len(traj) // WORLD
        mine = rows_of(traj, slice(rank * half, (rank + 1) * half))
        learner.accumulate(mine, T_STEPS, SPEC, total_samples=len(traj), total_steps=len(T_STEPS))
        # clone: on a 1-wide shard dim full_tensor() may alias the grad that clipping scales in place
        grads = {n: p.grad.full_tensor().clone() for n, p in policy.module.named_parameters() if p.requires_grad}
        parts = [None] * WORLD  # each rank's (metric sums, weight): its rows' share of the step mean
        dist.all_gather_object(parts, learner.accumulated())
        metrics = learner.optimizer_step()
        metrics["loss/policy"] = sum(s["loss/policy"] for s, _ in parts) / sum(w for _, w in parts)
        after = full_state_dict(policy.module)
        if rank == 0:
            torch.save({"grads": grads, "metrics": metrics, "after": after}, f"{tmp}/rank0.pt")
        dist.barrier()  # no rank tears gloo down while another still talks to it (SIGABRT at exit)
    finally:
        dist.destroy_process_group()
    # success: leave without interpreter teardown, where gloo's threads aborted a rank
    # ('terminate called without an active exception') on clean CI clones
    os._exit(0)


def _sharded(tmp_path: Path, lora_rank: int, mesh_shape=(WORLD,), reshard=True, bf16=False) -> dict:
    torch.save(four_sample_batch(tiny_policy(2, lora_rank)), tmp_path / "batch.pt")
    spawn_ranks(_worker, (str(tmp_path), lora_rank, mesh_shape, reshard, bf16), WORLD)
    return torch.load(tmp_path / "rank0.pt", weights_only=False)


def _run(tmp_path: Path, lora_rank: int, mesh_shape: tuple[int, ...] = (WORLD,), reshard: bool = True) -> None:
    want = _single_device(lora_rank)
    got = _sharded(tmp_path, lora_rank, mesh_shape, reshard)

    assert got["grads"].keys() == want["grads"].keys()
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"grad of {name}: {m}")
    assert got["metrics"]["train/grad_norm"] == pytest.approx(want["metrics"]["train/grad_norm"], rel=1e-5)
    assert got["metrics"]["loss/policy"] == pytest.approx(want["metrics"]["loss/policy"], rel=1e-5, abs=1e-7)

    assert got["after"].keys() == want["after"].keys()
    for name, w in want["after"].items():
        torch.testing.assert_close(got["after"][name], w, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"weight {name}: {m}")
    # not vacuous: the step moved the weights by about lr (AdamW's first step is ~lr * sign(g))
    change = max((w - want["before"][k]).abs().max().item() for k, w in want["after"].items())
    assert change > 0.5 * CONFIG.lr


def test_full_finetune_matches_single_device(tmp_path):
    _run(tmp_path, lora_rank=0)


def test_lora_matches_single_device(tmp_path):
    _run(tmp_path, lora_rank=4)


def _packed_worker(rank: int, tmp: str, lora_rank: int, pairs: int) -> None:
    """Rank 0 trains rows [0, 3), rank 1 row 3 (unequal shares: rank 1 pads with ghost passes),
    in passes of `pairs` (sample, slot) pairs; collectives counted per accumulate."""
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner.comm import CommCounter, count_fsdp
    from digenrl.learner.passes import pass_count
    from digenrl.learner.sharded import shard_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
        policy = tiny_policy(2, lora_rank)
        traj = torch.load(f"{tmp}/batch.pt", weights_only=False)
        shard_policy(policy, mesh)
        counter = CommCounter()
        count_fsdp(policy.module, counter)
        learner = Learner(policy, dataclasses.replace(CONFIG, pairs_per_pass=pairs))
        rows = slice(0, 3) if rank == 0 else slice(3, 4)
        passes = pass_count(3, len(T_STEPS), 0, pairs)
        learner.accumulate(traj, T_STEPS, SPEC, total_samples=len(traj), total_steps=len(T_STEPS), rows=rows,
                           passes=passes)
        comm = counter.take()
        grads = {n: p.grad.full_tensor().clone() for n, p in policy.module.named_parameters() if p.requires_grad}
        if rank == 0:
            torch.save({"grads": grads, "comm": comm, "passes": passes, "defers": learner.defers_reduction},
                       f"{tmp}/rank0.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.slow  # two spawned ranks
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_packed_passes_on_a_gang_match_the_per_timestep_single_device(tmp_path, lora_rank):
    """TSP's packed passes on an FSDP gang of 2, unequal shares (ghost passes pad rank 1):
    the gathered gradient equals the single device's per-timestep loop; every pass gathers
    each unit in forward and backward, and the gradient is reduce-scattered once per unit
    (no_sync between the passes: the tiny model's gradient is small)."""
    want = _single_device(lora_rank)["grads"]
    torch.save(four_sample_batch(tiny_policy(2, lora_rank)), tmp_path / "batch.pt")
    spawn_ranks(_packed_worker, (str(tmp_path), lora_rank, 4), WORLD)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    for name, g in want.items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"grad of {name}: {m}")
    assert got["passes"] == 2 and got["defers"]  # 3 rows x 2 slots in passes of 4 pairs
    units = 3  # two blocks + the root
    assert got["comm"]["comm/train/all_gather_calls"] == got["passes"] * 2 * units  # forward + backward
    trained = units if lora_rank == 0 else 2  # LoRA: the root unit holds no adapter, nothing to reduce
    assert got["comm"]["comm/train/reduce_scatter_calls"] == trained  # once per unit, after the last pass


@pytest.mark.slow  # the default tier keeps the full and LoRA cases
def test_no_reshard_after_forward_matches_single_device(tmp_path):
    _run(tmp_path, lora_rank=0, reshard=False)


@pytest.mark.slow
def test_hsdp_mesh_matches_single_device(tmp_path):
    # 2-D mesh (replicate=2, shard=1): the replicas all-reduce instead of reduce-scatter
    _run(tmp_path, lora_rank=4, mesh_shape=(WORLD, 1))


@pytest.mark.slow
def test_mixed_precision_keeps_fp32_masters(tmp_path):
    # bf16 compute is not the fp32 rollout's policy (ratio != 1, some samples clip), so
    # only smoke-level agreement: fp32 sharded masters and gradients, the same direction
    want = _single_device(lora_rank=0)
    got = _sharded(tmp_path, lora_rank=0, bf16=True)
    assert all(g.dtype == torch.float32 for g in got["grads"].values())
    assert all(w.dtype == torch.float32 for w in got["after"].values())
    g_bf16 = torch.cat([got["grads"][k].flatten() for k in want["grads"]])
    g_fp32 = torch.cat([g.flatten() for g in want["grads"].values()])
    cosine = torch.nn.functional.cosine_similarity(g_bf16, g_fp32, dim=0).item()
    assert cosine > 0.99
    change = max((w - want["before"][k]).abs().max().item() for k, w in got["after"].items())
    assert change > 0.5 * CONFIG.lr


# ---- DiffusionNFT's old policy on sharded parameters (train.nft_decay) ----------------------

NFT_SPEC = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(), kind="ode", seed=5, draw_levels=4)
NFT_CONFIG = LearnerConfig(loss="nft", lr=1e-3, nft_decay=0.5, nft_decay_rate=0.5, nft_beta=0.5)


def _lagging_old(params) -> dict:
    """Old weights that differ from the live ones (as after a few refreshes), the same on every rank."""
    g = torch.Generator().manual_seed(3)
    return {n: p.detach() + 0.05 * torch.randn(p.shape, generator=g) for n, p in params.items()}


def _nft_single(lora_rank: int, traj) -> dict:
    policy = tiny_policy(2, lora_rank)
    learner = Learner(policy, NFT_CONFIG)
    learner.old.load_state_dict(_lagging_old(learner.old.params))
    learner.accumulate(traj, [0, 1], NFT_SPEC, total_samples=len(traj), total_steps=2)
    grads = {n: p.grad.clone() for n, p in policy.module.named_parameters() if p.requires_grad}
    learner.optimizer_step(version=1)
    return {"grads": grads, "old": learner.old.state_dict(), "after": trainable_state_dict(policy.module)}


def _nft_worker(rank: int, tmp: str, lora_rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from digenrl.learner.sharded import full_state_dict, full_tensors, shard_policy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("shard",))
        policy = tiny_policy(2, lora_rank)
        traj = torch.load(f"{tmp}/batch.pt", weights_only=False)
        old = _lagging_old({n: p for n, p in policy.module.named_parameters() if p.requires_grad})
        shard_policy(policy, mesh, reshard_after_forward=True, mixed_precision=False)
        learner = Learner(policy, NFT_CONFIG)
        for n, t in learner.old.shadow.items():  # this rank's shards of the same old weights
            t.copy_(distribute_tensor(old[n], t.device_mesh, t.placements))
        half = len(traj) // WORLD
        learner.accumulate(rows_of(traj, slice(rank * half, (rank + 1) * half)), [0, 1], NFT_SPEC,
                           total_samples=len(traj), total_steps=2)
        grads = {n: p.grad.full_tensor().clone() for n, p in policy.module.named_parameters() if p.requires_grad}
        learner.optimizer_step(version=1)
        out = {"grads": grads, "old": full_tensors(learner.old.shadow), "after": full_state_dict(policy.module)}
        if rank == 0:
            torch.save(out, f"{tmp}/rank0.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.slow  # ~30 s a case on 2 busy cores (two spawned ranks)
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_nft_old_policy_on_sharded_parameters_matches_single_device(tmp_path, lora_rank):
    """Each rank keeps and swaps its shards of the old policy: v_old from the swapped shards
    gives the single-device gradient, and the refresh (d = 0.5 at version 1) the same old weights."""
    policy = tiny_policy(2, lora_rank)
    prompts = ["a red circle", "a red circle", "a blue square", "a blue square"]
    coords = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    with torch.no_grad():
        traj = advance(policy, start(policy, prompts, coords, NFT_SPEC, step=0, version=0), NFT_SPEC)
    traj.advantages = torch.tensor(ADVANTAGES)
    torch.save(traj, tmp_path / "batch.pt")
    want = _nft_single(lora_rank, traj)
    spawn_ranks(_nft_worker, (str(tmp_path), lora_rank), WORLD)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    # weights after AdamW: its first step is ~lr * sign(g), so a near-zero gradient's round-off moves
    # a weight by up to ~1e-6 here (lr 1e-3); the existing sharded tests allow 1e-5 for the same reason.
    # The refreshed old policy is d * old + (1 - d) * after (d = 0.5): it carries half of that bound
    # (1e-6 failed here at 1.23e-6 on 1 of 6,144 entries, identically on the tree before stop 51)
    for key, atol in (("grads", 1e-6), ("old", 5e-6), ("after", 1e-5)):
        assert got[key].keys() == want[key].keys(), key
        for name, t in want[key].items():
            torch.testing.assert_close(got[key][name], t, rtol=1e-5, atol=atol, msg=lambda m, k=key, n=name: f"{k} {n}: {m}")


# ---- which modules become FSDP units ---------------------------------------------------------

def _z_image_inputs():
    """Two samples in Z-Image's list layout: latents (C, 1, H, W), times, captions of unequal length."""
    g = torch.Generator().manual_seed(1)
    latents = [torch.randn(4, 1, 4, 4, generator=g) for _ in range(2)]
    captions = [torch.randn(5, 8, generator=g), torch.randn(3, 8, generator=g)]  # (L_i, cap_feat_dim)
    return latents, torch.tensor([0.3, 0.8]), captions


def _z_image_worker(rank: int, tmp: str) -> None:
    from types import SimpleNamespace

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from digenrl.learner.sharded import shard_policy
    from tests.models.tiny_diffusers_new import z_image_transformer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        module = z_image_transformer(n_layers=2)
        shard_policy(SimpleNamespace(module=module), init_device_mesh("cpu", (WORLD,)))
        units = sorted(name for name, m in module.named_modules() if isinstance(m, FSDPModule))
        with torch.no_grad():
            out = torch.stack(module(*_z_image_inputs(), return_dict=False)[0])
        if rank == 0:
            torch.save({"units": units, "out": out}, f"{tmp}/rank0.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.slow
def test_z_image_blocks_are_fsdp_units(tmp_path):
    """Z-Image keeps its blocks under `noise_refiner`, `context_refiner` and `layers`, none of
    BLOCK_LISTS' names: each block must still be its own FSDP unit (else the whole model is
    one root unit, gathered whole for every forward), and the sharded forward is the model's."""
    pytest.importorskip("diffusers")
    from digenrl.learner.sharded import transformer_blocks
    from tests.models.tiny_diffusers_new import z_image_transformer

    module = z_image_transformer(n_layers=2)
    blocks = transformer_blocks(module)
    expected = [*module.noise_refiner, *module.context_refiner, *module.layers]  # forward order
    assert len(blocks) == len(expected) == 4 and all(a is b for a, b in zip(blocks, expected))

    class Other(torch.nn.Module):  # another family's `layers` list is not taken for blocks
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    assert transformer_blocks(Other()) == []
    assert len(transformer_blocks(tiny_policy(2, 0).module)) == 2  # the tiny DiT's `blocks`, as before

    with torch.no_grad():
        want = torch.stack(module(*_z_image_inputs(), return_dict=False)[0])
    spawn_ranks(_z_image_worker, (str(tmp_path),), WORLD)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    # one unit per block plus the root (""); nothing else
    assert got["units"] == ["", "context_refiner.0", "layers.0", "layers.1", "noise_refiner.0"]
    torch.testing.assert_close(got["out"], want, rtol=1e-5, atol=1e-6)


def _new_family_worker(rank: int, tmp: str, family: str, folder: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from digenrl.learner.sharded import shard_policy
    from tests.models.adapter_checks import PROMPTS, load_tiny
    from tests.models.tiny_diffusers_more import AUDIO_SETUPS, COSMOS_SETUPS, MORE_SETUPS, install_cosmos_resize_stand_in

    torch.set_num_threads(1)
    if family in COSMOS_SETUPS:
        install_cosmos_resize_stand_in()  # torchvision's resize, absent here (tiny_diffusers_more.py)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        policy = load_tiny({**MORE_SETUPS, **AUDIO_SETUPS, **COSMOS_SETUPS}, {family: Path(folder)}, None, family,
                           Path(tmp) / f"cache{rank}",
                           train="lora", lora_rank=4)
        shard_policy(policy, init_device_mesh("cpu", (WORLD,)))
        units = sorted(name for name, m in policy.module.named_modules() if isinstance(m, FSDPModule))
        x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out = policy.velocity(x, torch.tensor([0.9, 0.4]), policy.encode_prompts(PROMPTS))
        if rank == 0:
            torch.save({"units": units, "out": out}, f"{tmp}/rank0.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["flux2", "qwen-image-2.1", "sana", "sana-video", "hunyuan-video-1.5", "ltx2",
                                    "cosmos-predict2.5"])
def test_new_family_blocks_are_fsdp_units(family, tmp_path, monkeypatch):
    """Issue 28's families under shard_policy (LoRA injected first, as the trainer does): one FSDP
    unit per transformer block plus the root, and the sharded velocity is the unsharded one."""
    pytest.importorskip("diffusers")
    from tests.models.adapter_checks import PROMPTS, load_tiny
    from tests.models.tiny_diffusers_more import AUDIO_SETUPS, COSMOS_SETUPS, MORE_SETUPS, install_cosmos_resize_stand_in

    setups = {**MORE_SETUPS, **AUDIO_SETUPS, **COSMOS_SETUPS}  # ltx2: the flat video + audio latent
    if family in COSMOS_SETUPS:  # torchvision's resize, absent here; undone after the test
        from diffusers.models.transformers import transformer_cosmos

        monkeypatch.setattr(transformer_cosmos, "transforms", getattr(transformer_cosmos, "transforms", None),
                            raising=False)
        install_cosmos_resize_stand_in()
    folder = setups[family][0](tmp_path / "pipe")
    policy = load_tiny(setups, {family: folder}, None, family, tmp_path / "cache", train="lora", lora_rank=4)
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = policy.velocity(x, torch.tensor([0.9, 0.4]), policy.encode_prompts(PROMPTS))
    module = policy.module
    blocks = [f"transformer_blocks.{i}" for i in range(len(module.transformer_blocks))]
    blocks += [f"single_transformer_blocks.{i}" for i in range(len(getattr(module, "single_transformer_blocks", [])))]
    spawn_ranks(_new_family_worker, (str(tmp_path), family, str(folder)), WORLD)
    got = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert got["units"] == sorted(["", *blocks])
    torch.testing.assert_close(got["out"], want, rtol=1e-5, atol=1e-6)

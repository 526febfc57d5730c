"""Ulysses sequence parallelism (digenrl.models.sequence_parallel) on tiny Wan and HunyuanVideo,
over 2 and 4 CPU processes (gloo), against the same model on one process.

- the transformer: output, and every parameter's gradient summed over the group, equal the
  single-process ones (token counts that no degree divides);
- a rollout (start + advance with the SDE, as a rollout worker runs it): latents and log-probs
  equal within 1e-5;
- a hand-over (TAG): a trajectory a gang started, finished on one process, ends the same;
- training on a gang (FSDP over the group + sequence parallelism over the same ranks, every
  rank on the same rows): the Learner's gradients equal the single-device ones (LoRA, full).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("diffusers")

from digenrl.learner.comm import CommCounter  # noqa: E402
from digenrl.math import sigma_schedule  # noqa: E402
from digenrl.models import sequence_parallel as sp_mod  # noqa: E402
from digenrl.rollout import SampleSpec, advance, start  # noqa: E402
from tests.helpers.ranks import spawn_ranks  # noqa: E402
from tests.models.tiny_diffusers import FAMILY_SETUPS, fake_text_cond  # noqa: E402

HEADS = 4  # divisible by every degree tested
# latent grids whose token counts no tested degree divides: Wan 3 frames x 3 x 1 patches = 9
# (patch 1x2x2 of a 3x6x2 latent), HunyuanVideo 3 x 3 x 1 = 9 (patch 1)
SIZES = {"wan": dict(height=48, width=16, num_frames=9), "hunyuan-video": dict(height=24, width=8, num_frames=9)}
PROMPTS = ["a red cat", "a red cat", "a dog", "a dog"]
COORDS = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
SPEC = SampleSpec(sigmas=sigma_schedule(3, 3.0), sde_steps=(0, 1))


# ----------------------------------------------------------------------------- processes
def _spawn(fn, world: int, tmp: Path, *args) -> dict:
    spawn_ranks(_rank_main, (world, str(tmp), fn, args), world)
    return torch.load(tmp / "rank0.pt", weights_only=False)


def _rank_main(rank: int, world: int, tmp: str, fn, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world)
    try:
        out = fn(rank, world, *args)
        if rank == 0:
            torch.save(out, f"{tmp}/rank0.pt")
        dist.barrier()  # no rank tears gloo down while another still talks to it
    finally:
        dist.destroy_process_group()
    os._exit(0)  # skip interpreter teardown, where gloo's threads can abort (see test_sharded.py)


# ----------------------------------------------------------------------------- the transformer
def _transformer(family: str):
    torch.manual_seed(0)
    if family == "wan":
        from diffusers import WanTransformer3DModel

        module = WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=8, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
        x = torch.randn(2, 4, 3, 6, 10)  # 3 x 3 x 5 = 45 tokens
        kwargs = dict(timestep=torch.tensor([500.0, 300.0]), encoder_hidden_states=torch.randn(2, 7, 32))
    else:
        from diffusers import HunyuanVideoTransformer3DModel

        module = HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=HEADS, attention_head_dim=10, num_layers=2,
            num_single_layers=2, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
            text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4))
        x = torch.randn(2, 4, 3, 3, 5)  # 45 tokens
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[1, 4:] = 0  # padded text: the key mask must survive the split
        kwargs = dict(timestep=torch.tensor([500.0, 300.0]), encoder_hidden_states=torch.randn(2, 6, 16),
                      encoder_attention_mask=mask, pooled_projections=torch.randn(2, 8),
                      guidance=torch.tensor([3500.0, 3500.0]))
    for p in module.parameters():  # off the zero-initialised gates, so every weight gets a gradient
        p.data.add_(0.02 * torch.randn_like(p))
    return module, x, kwargs


def _forward_backward(module, x, kwargs):
    out = module(hidden_states=x, **kwargs, return_dict=False)[0]
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _transformer_rank(rank, world, family, ckpt):
    module, x, kwargs = _transformer(family)
    if ckpt:
        module.enable_gradient_checkpointing()
    counter = CommCounter()
    sp_mod.enable(module, sp_mod.SequenceParallel(dist.group.WORLD, counter))
    out, grads = _forward_backward(module, x, kwargs)
    counted = counter.take()
    for g in grads.values():  # each rank holds its part of a parameter's gradient
        dist.all_reduce(g)
    return {"out": out, "grads": grads, "comm": counted}


# the default tier: degree 2; checkpointing and degree 4 in the slow tier (CI time)
@pytest.mark.parametrize("world,ckpt", [(2, False), pytest.param(2, True, marks=pytest.mark.slow),
                                        pytest.param(4, False, marks=pytest.mark.slow)],
                         ids=["2", "2-checkpointing", "4"])
@pytest.mark.parametrize("family", [pytest.param("wan", marks=pytest.mark.slow), "hunyuan-video"])  # hunyuan: + text gathers
def test_transformer_output_and_gradients(family, world, ckpt, tmp_path):
    """Output and summed gradients equal one process's, and the bytes one rank counted for the
    forward and backward (gradient checkpointing: the blocks' forwards again) are the ones
    digenrl.sim.sp.forward_bytes predicts."""
    from digenrl.sim.sp import SpDims, forward_bytes

    module, x, kwargs = _transformer(family)
    want_out, want_grads = _forward_backward(module, x, kwargs)
    got = _spawn(_transformer_rank, world, tmp_path, family, ckpt)
    text = kwargs["encoder_hidden_states"].shape[1] if family == "hunyuan-video" else None
    pred = forward_bytes(SpDims.from_module(module, text), batch=2, tokens=45, degree=world, elem_bytes=4,
                         backward=True, recompute=ckpt)
    assert {k: v for k, v in got["comm"].items() if k.endswith("_bytes")} == \
        {f"comm/train/{k}_bytes": v for k, v in pred.items() if v}
    torch.testing.assert_close(got["out"], want_out, rtol=1e-5, atol=1e-6)
    assert got["grads"].keys() == want_grads.keys()
    scale = max(g.abs().max().item() for g in want_grads.values())
    for name, g in want_grads.items():  # atol on the gradient's scale: some (a key bias) are ~0 exactly
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")


def test_degree_must_divide_heads():
    module, _, _ = _transformer("wan")

    class Three(sp_mod.SequenceParallel):
        def __init__(self):
            super().__init__()
            self.degree = 3

    with pytest.raises(ValueError, match="not divisible by 3"):
        sp_mod.enable(module, Three())


def test_other_models_are_refused():
    with pytest.raises(ValueError, match="sequence parallelism is built for"):
        sp_mod.enable(torch.nn.Linear(2, 2), sp_mod.SequenceParallel())


# ----------------------------------------------------------------------------- rollout
@pytest.fixture(scope="module")
def pipelines(tmp_path_factory) -> dict[str, Path]:
    return {family: FAMILY_SETUPS[family][0](tmp_path_factory.mktemp(family.replace("-", "_")), heads=HEADS)
            for family in SIZES}


def _policy(family: str, path: Path, cache: Path, **extra):
    from digenrl.models.diffusers_adapters import load_policy

    _, opts, shapes = FAMILY_SETUPS[family]
    policy = load_policy(family, str(path), prompt_cache_dir=str(cache), **{**opts, **SIZES[family], **extra})
    if shapes is not None:
        for prompt in sorted(set(PROMPTS)):
            policy.cache.put(prompt, fake_text_cond(shapes, prompt))
    return policy


def _rollout(policy):
    with torch.no_grad():
        traj = advance(policy, start(policy, PROMPTS, COORDS, SPEC, step=0, version=0), SPEC)
    return traj


def _rollout_rank(rank, world, family, path, cache):
    policy = _policy(family, path, cache / f"rank{rank}")
    counter = CommCounter()
    with counter.phase("generate"):
        policy.enable_sequence_parallel(dist.group.WORLD, counter)
        traj = _rollout(policy)
    return {"latents": traj.latents, "log_probs": traj.log_probs, "comm": counter.take()}


@pytest.mark.slow  # the default tier runs a rollout gang end to end (tests/runtime/test_sequence_parallel_gangs.py)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("family", ["wan", "hunyuan-video"])
def test_rollout_gang_matches_one_rank(family, world, pipelines, tmp_path):
    want = _rollout(_policy(family, pipelines[family], tmp_path / "cache"))
    got = _spawn(_rollout_rank, world, tmp_path, family, pipelines[family], tmp_path)
    torch.testing.assert_close(got["latents"], want.latents, rtol=1e-5, atol=1e-5)
    sde = list(SPEC.sde_steps)
    torch.testing.assert_close(got["log_probs"][:, sde], want.log_probs[:, sde], rtol=1e-5, atol=1e-5)
    assert got["comm"]["comm/generate/all_to_all_bytes"] > 0  # it did run sequence-parallel


def _segment_rank(rank, world, family, path, cache, t_end):
    policy = _policy(family, path, cache / f"rank{rank}")
    policy.enable_sequence_parallel(dist.group.WORLD)
    with torch.no_grad():
        return advance(policy, start(policy, PROMPTS, COORDS, SPEC, step=0, version=0), SPEC, t_end)


@pytest.mark.parametrize("family", ["wan", pytest.param("hunyuan-video", marks=pytest.mark.slow)])
def test_hand_over_from_a_gang_to_one_rank(family, pipelines, tmp_path):
    """TAG: a gang of 2 runs the first denoising step, one process (no sequence parallelism)
    finishes the trajectory; it ends where a trajectory that never moved does."""
    policy = _policy(family, pipelines[family], tmp_path / "cache")
    want = _rollout(policy)
    moved = _spawn(_segment_rank, 2, tmp_path, family, pipelines[family], tmp_path, 1)
    assert moved.t_done == 1
    with torch.no_grad():
        advance(policy, moved, SPEC)
    torch.testing.assert_close(moved.latents, want.latents, rtol=1e-5, atol=1e-5)
    sde = list(SPEC.sde_steps)
    torch.testing.assert_close(moved.log_probs[:, sde], want.log_probs[:, sde], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- training
def _train_batch(policy):
    traj = _rollout(policy)
    traj.advantages = torch.tensor([1.0, -1.0, 0.5, -2.0])
    return traj


def _gradients(policy, traj, learner_cls, config):
    learner = learner_cls(policy, config)
    learner.accumulate(traj, [0, 1], SPEC, total_samples=len(traj), total_steps=2)
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in policy.module.named_parameters() if p.requires_grad}


def _train_rank(rank, world, family, path, cache, lora_rank, batch):
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner import Learner, LearnerConfig
    from digenrl.learner.sharded import shard_policy

    policy = _policy(family, path, cache / f"rank{rank}", **_train_opts(lora_rank))
    _perturb(policy)
    policy.enable_sequence_parallel(dist.group.WORLD, CommCounter())  # before FSDP wraps the module
    shard_policy(policy, init_device_mesh("cpu", (world,)))
    traj = torch.load(batch, weights_only=False)  # every rank trains every row, on its tokens
    return {"grads": _gradients(policy, traj, Learner, LearnerConfig())}


def _train_opts(lora_rank: int) -> dict:
    return dict(train="lora", lora_rank=lora_rank, lora_alpha=2.0 * lora_rank) if lora_rank else dict(train="full")


def _perturb(policy):
    """The same nudge on every rank: off the zero-initialised gates and LoRA B."""
    g = torch.Generator().manual_seed(1)
    for _, p in sorted(policy.module.named_parameters()):
        p.data.add_(0.02 * torch.randn(p.shape, generator=g))


# the default tier: Wan under LoRA; the rest in the slow tier
@pytest.mark.parametrize("family,lora_rank", [
    pytest.param("wan", 0, marks=pytest.mark.slow, id="wan-full"), pytest.param("wan", 4, id="wan-lora"),
    pytest.param("hunyuan-video", 0, marks=pytest.mark.slow, id="hunyuan-video-full"),
    pytest.param("hunyuan-video", 4, marks=pytest.mark.slow, id="hunyuan-video-lora")])
def test_training_gang_gradients_match_one_device(family, lora_rank, pipelines, tmp_path):
    from digenrl.learner import Learner, LearnerConfig

    policy = _policy(family, pipelines[family], tmp_path / "cache", **_train_opts(lora_rank))
    _perturb(policy)
    traj = _train_batch(policy)
    torch.save(traj, tmp_path / "batch.pt")
    want = _gradients(policy, traj, Learner, LearnerConfig())
    got = _spawn(_train_rank, 2, tmp_path, family, pipelines[family], tmp_path, lora_rank, tmp_path / "batch.pt")
    assert got["grads"].keys() == want.keys()
    scale = max(g.abs().max().item() for g in want.values())
    assert scale > 0
    for name, g in want.items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")


# ----------------------------------------------------------------------------- HunyuanVideo 1.5
def _transformer15(i2v: bool = False):
    """Tiny HunyuanVideo 1.5 with padded text in both encoders (its attention gets a (B, 1, Q, K)
    query-and-key mask). Text-to-video: the empty image condition (zero image tokens, which the
    transformer masks out, and zero condition latents). Image-to-video: image tokens it attends
    to, and a first frame's latents with its mask on channels."""
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(0)
    module = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=HEADS, attention_head_dim=8, num_layers=2,
        num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=8, rope_axes_dim=(2, 2, 4))
    for p in module.parameters():
        p.data.add_(0.02 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    condition = torch.zeros(2, 5, 3, 3, 5)
    image_embeds = torch.zeros(2, 5, 8)
    if i2v:
        condition[:, :4, 0] = torch.randn(2, 4, 3, 5, generator=g)
        condition[:, 4, 0] = 1.0
        image_embeds = torch.randn(2, 5, 8, generator=g)
    x = torch.cat([torch.randn(2, 4, 3, 3, 5, generator=g), condition], dim=1)  # 45 tokens
    mask, mask_2 = torch.ones(2, 6, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)
    mask[1, 4:], mask_2[0, 2:] = 0, 0
    kwargs = dict(timestep=torch.tensor([500.0, 300.0]), encoder_hidden_states=torch.randn(2, 6, 16, generator=g),
                  encoder_attention_mask=mask, encoder_hidden_states_2=torch.randn(2, 4, 8, generator=g),
                  encoder_attention_mask_2=mask_2, image_embeds=image_embeds)
    return module, x, kwargs


def _transformer15_rank(rank, world, i2v):
    module, x, kwargs = _transformer15(i2v)
    sp_mod.enable(module, sp_mod.SequenceParallel(dist.group.WORLD))
    out, grads = _forward_backward(module, x, kwargs)
    for g in grads.values():
        dist.all_reduce(g)
    return {"out": out, "grads": grads}


@pytest.mark.slow  # 105 s each on the shared 2-core machine (two spawned processes importing diffusers)
@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_hunyuan_video15_output_and_gradients(tmp_path, i2v):
    """HunyuanVideo 1.5 over 2 ranks: output and summed gradients equal one process's (45 tokens,
    not divisible by 2; padded text in both encoders), with the empty image condition of
    text-to-video and with the image tokens and first frame of image-to-video."""
    module, x, kwargs = _transformer15(i2v)
    want_out, want_grads = _forward_backward(module, x, kwargs)
    got = _spawn(_transformer15_rank, 2, tmp_path, i2v)
    torch.testing.assert_close(got["out"], want_out, rtol=1e-5, atol=1e-6)
    assert got["grads"].keys() == want_grads.keys()
    scale = max(g.abs().max().item() for g in want_grads.values())
    for name, g in want_grads.items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-5 * scale,
                                   msg=lambda m, name=name: f"grad of {name}: {m}")

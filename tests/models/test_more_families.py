"""FLUX.2-dev, Qwen-Image 2.1, SANA, SANA-Video and HunyuanVideo 1.5 (text-to-video) on tiny
random-weight pipelines (issue 28; CPU, float32, no hub access).

The checks of test_new_families.py for each: the ODE through our velocity reproduces the
diffusers pipeline's own latents (timestep convention, sign, packing, latent normalisation,
embedded guidance) on the sigmas that `sampling.sigmas=diffusers` computes from the folder,
a Flow-GRPO rollout then a GRPO step with ratio == 1 on-policy, weight sync, the default LoRA
targets landing, a full fine-tune step, and one FSDP unit per transformer block.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.math import sde_step  # noqa: E402
from digenrl.models.diffusers_adapters import load_policy  # noqa: E402
from digenrl.models.protocol import Policy  # noqa: E402
from tests.models.adapter_checks import (check_full_finetune_step, PROMPTS, assert_blocks_are_fsdp_units,  # noqa: E402
                                         assert_lora_landed, check_rollout_decode_step_and_sync, load_tiny)
from tests.models.tiny_diffusers_more import MORE_SETUPS  # noqa: E402

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()

MORE = list(MORE_SETUPS)


def load(folders, tmp_path_factory, family: str, cache_dir, **extra):
    return load_tiny(MORE_SETUPS, folders, tmp_path_factory, family, cache_dir, **extra)


# The slowest two (FLUX.2-dev: its 30-layer text encoder loaded twice; HunyuanVideo 1.5: four
# video decodes) run in the slow tier; the default tier keeps their ODE check and their full
# fine-tune step, which asserts ratio == 1 too.
SLOW_ROLLOUT = ("flux2", "hunyuan-video-1.5")
ROLLOUT = [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_ROLLOUT else f for f in MORE]


@pytest.mark.parametrize("family", ROLLOUT)
def test_rollout_train_step_and_weight_sync(family, folders, tmp_path_factory, tmp_path):
    """Also: the default LoRA targets all land (each names a real Linear: peft skips unknown
    names silently), and every block is an FSDP unit."""
    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="lora", lora_rank=4)
    assert isinstance(policy, Policy)
    assert_lora_landed(policy.module, policy.default_lora_targets)
    assert_blocks_are_fsdp_units(policy.module)
    check_rollout_decode_step_and_sync(
        policy, lambda: load(folders, tmp_path_factory, family, tmp_path / "cache", train="lora", lora_rank=4))


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f == "sana-video" else f
                                    for f in MORE])
def test_full_finetune_step(family, folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="full", gradient_checkpointing=True)
    check_full_finetune_step(policy)


def _pipeline(family: str, folder):
    from digenrl.models.diffusers_adapters import policy_class

    cls = getattr(diffusers, policy_class(family).pipeline_class)
    no_text = policy_class(family)._text_components_skipped() if MORE_SETUPS[family][2] is not None else {}
    pipe = cls.from_pretrained(str(folder), **no_text)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _pipeline_latents(family: str, pipe, policy, cond, x0: torch.Tensor) -> torch.Tensor:
    """The diffusers pipeline itself, 2 deterministic steps from x0, CFG off, in our layout."""
    opts = MORE_SETUPS[family][1]
    common = dict(height=opts["height"], width=opts["width"], num_inference_steps=2, output_type="latent",
                  return_dict=False)
    text = dict(prompt=list(PROMPTS), max_sequence_length=opts["max_sequence_length"])
    if family == "flux2":  # embedded guidance: the adapter's default scale, 3.5
        return pipe(latents=x0, guidance_scale=3.5, **text, **common)[0]  # packed: (B, h*w, 4C)
    if family == "sana":
        return pipe(latents=x0, guidance_scale=1.0, use_resolution_binning=False, **text, **common)[0]
    if family == "sana-video":
        return pipe(latents=x0, frames=opts["num_frames"], guidance_scale=1.0, use_resolution_binning=False,
                    **text, **common)[0]
    if family == "hunyuan-video-1.5":
        return pipe(prompt_embeds=cond["prompt_embeds"], prompt_embeds_mask=cond["prompt_embeds_mask"],
                    prompt_embeds_2=cond["prompt_embeds_2"], prompt_embeds_mask_2=cond["prompt_embeds_mask_2"],
                    latents=x0, num_frames=opts["num_frames"], **common)[0]
    # qwen-image-2.1: one prompt at a time with its own tokens (the pipeline pads a batch to its
    # longest prompt, which moves the image's RoPE position: see qwen_image21.py)
    c, h, w = policy.latent_shape
    rows = []
    for i in range(len(PROMPTS)):
        n = int(cond["prompt_embeds_mask"][i].sum())
        packed = x0[i : i + 1].flatten(2).transpose(1, 2)  # (1, h*w, C)
        out = pipe(prompt_embeds=cond["prompt_embeds"][i : i + 1, :n], latents=packed, **common)[0]
        rows.append(out.transpose(1, 2).reshape(1, c, h, w))
    return torch.cat(rows)


@pytest.mark.parametrize("family", MORE)
def test_ode_sampling_matches_diffusers_pipeline_on_its_grid(family, folders, tmp_path_factory, tmp_path):
    from digenrl.config.model import ModelConfig
    from digenrl.config.sampling import SamplingConfig
    from digenrl.models import sampling_sigmas

    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="frozen")
    folder = folders[family]
    cond = policy.encode_prompts(PROMPTS)
    pipe = _pipeline(family, folder)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    theirs = _pipeline_latents(family, pipe, policy, cond, x0)

    # sampling.sigmas=diffusers computes, from the folder, the grid the pipeline just used
    opts = MORE_SETUPS[family][1]
    model = ModelConfig(name=family, path=str(folder), height=opts["height"], width=opts["width"])
    sigmas = sampling_sigmas(model, SamplingConfig(sigmas="diffusers"), 2)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    assert sigmas[1] != 0.5  # a shifted grid, not linspace

    x = x0
    with torch.no_grad():
        for i in range(2):
            v = policy.velocity(x, sigmas[i].expand(len(PROMPTS)), cond)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    ours = x.flatten(2).transpose(1, 2) if family == "flux2" else x  # FLUX.2-dev returns its tokens
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(x, x0)


def test_flux2_guidance_is_a_model_input(folders, tmp_path_factory, tmp_path):
    """model.guidance reaches FLUX.2-dev's guidance embedder: another scale, another velocity."""
    policy = load(folders, tmp_path_factory, "flux2", tmp_path / "cache", train="frozen", guidance_scale=2.0)
    cond = policy.encode_prompts(PROMPTS)
    assert torch.equal(cond["guidance"], torch.full((2,), 2.0))
    x = torch.randn(2, *policy.latent_shape)
    with torch.no_grad():
        v2 = policy.velocity(x, torch.full((2,), 0.6), cond)
        v5 = policy.velocity(x, torch.full((2,), 0.6), {**cond, "guidance": torch.full((2,), 5.0)})
    assert not torch.allclose(v2, v5)


def test_qwen_image21_row_does_not_depend_on_its_batch_mates(folders, tmp_path_factory, tmp_path):
    """Prompts of different lengths in one batch: each row's velocity is the one it gets alone
    (the pipeline's batch padding would shift the shorter prompt's image position)."""
    policy = load(folders, tmp_path_factory, "qwen-image-2.1", tmp_path / "cache", train="frozen")
    mask = torch.zeros(3, 8, dtype=torch.long)
    mask[0, :5], mask[1, :8], mask[2, :5] = 1, 1, 1  # rows 0 and 2 share a length
    g = torch.Generator().manual_seed(0)
    cond = {"prompt_embeds": torch.randn(3, 8, 16, generator=g) * mask[..., None], "prompt_embeds_mask": mask}
    x = torch.randn(3, *policy.latent_shape, generator=g)
    sigma = torch.tensor([0.9, 0.5, 0.3])
    with torch.no_grad():
        together = policy.velocity(x, sigma, cond)
        for i in range(3):
            alone = policy.velocity(x[i : i + 1], sigma[i : i + 1], {k: v[i : i + 1] for k, v in cond.items()})
            torch.testing.assert_close(together[i : i + 1], alone, rtol=1e-5, atol=1e-6)
        padded = policy.module(  # what the pipeline would run for row 0 in this batch: padded to 8 tokens
            hidden_states=x[:1].flatten(2).transpose(1, 2), encoder_hidden_states=cond["prompt_embeds"][:1],
            encoder_hidden_states_mask=mask[:1].bool(), timestep=sigma[:1], img_shapes=[[(1, 2, 2)]],
            img_mask=torch.cat([torch.zeros(1, 8, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool)], 1),
            return_dict=False)[0][:, -4:]  # the joint output's image tokens, as the pipeline slices
    assert not torch.allclose(padded.transpose(1, 2).reshape(together[:1].shape), together[:1], atol=1e-4)


def test_qwen_image21_textless_load_refuses_encoding(folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, "qwen-image-2.1", tmp_path / "cache", train="frozen")
    assert policy.text_pipeline is None
    with pytest.raises(RuntimeError, match="precompute_prompts"):
        policy.encode_prompts(["never cached"])


def test_sana_refuses_a_guidance_embedding_transformer(tmp_path):
    from diffusers import SanaTransformer2DModel

    from tests.models.tiny_diffusers_more import build_sana

    root = build_sana(tmp_path / "sana")
    cfg = SanaTransformer2DModel.load_config(root / "transformer")
    sprint = SanaTransformer2DModel.from_config({**cfg, "guidance_embeds": True})
    sprint.save_pretrained(root / "transformer")
    with pytest.raises(ValueError, match="SANA-Sprint is not supported"):
        load_policy("sana", str(root), height=16, width=16, max_sequence_length=8)


RECIPES = {"flux2": "flux2_pickscore.yaml", "qwen-image-2.1": "qwen_image21_pickscore.yaml",
           "sana": "sana_pickscore.yaml", "sana-video": "sana_video_pickscore.yaml",
           "hunyuan-video-1.5": "hunyuan_video15_pickscore.yaml"}


@pytest.mark.parametrize("family", MORE)
def test_recipe_is_the_familys_and_its_lora_targets_are_linear_layers(family, folders, tmp_path_factory, tmp_path):
    """Each new family has a recipe (tests/test_recipes.py validates every recipe); one that
    lists its own LoRA targets names an nn.Linear of the family's transformer with each."""
    from pathlib import Path

    from digenrl.config.schema import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / RECIPES[family])
    assert cfg.model.name == family and cfg.model.prompt_cache
    if cfg.model.lora_targets:
        policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="frozen")
        linear = [n for n, m in policy.module.named_modules() if isinstance(m, torch.nn.Linear)]
        for t in cfg.model.lora_targets:
            assert any(n == t or n.endswith("." + t) for n in linear), (family, t)

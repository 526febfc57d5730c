"""HunyuanVideo 1.5 image-to-video on a tiny pipeline (32x32 pixels, 5 frames), saved with
`save_pretrained` and loaded back through `load_policy` (CPU, float32; text through the prompt
cache, as for text-to-video in test_more_families.py):
- two ODE steps equal HunyuanVideo15ImageToVideoPipeline's own (output_type="latent") from the
  same first frame, text embeddings and initial noise, on the grid `sampling.sigmas=diffusers`
  computes from the folder (equal to the pipeline's);
- a group rollout from per-row first frames, one LoRA step (ratio == 1, adapters move) and a
  weight sync (adapter_checks.check_lora_step_and_sync);
- the first frame acts: another image changes the velocity, through both the image tokens and
  the condition latents;
- a full fine-tune step, and every transformer block found as an FSDP unit (the sharded run of
  the same transformer class: test_sharded.py's HunyuanVideo 1.5 case).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.math import sde_step  # noqa: E402
from digenrl.models.families import FAMILIES  # noqa: E402
from digenrl.models.protocol import cond_repeat, conditioning_of, encode_inputs  # noqa: E402
from tests.models.adapter_checks import (  # noqa: E402
    GROUP, PROMPTS, assert_blocks_are_fsdp_units, check_full_finetune_step, check_lora_step_and_sync, load_tiny,
    rollout,
)
from tests.models.tiny_diffusers import tiny_images  # noqa: E402
from tests.models.tiny_diffusers_more import MORE_CONDITIONED_SETUPS  # noqa: E402

FAMILY = "hunyuan-video-1.5-i2v"
SETUPS = MORE_CONDITIONED_SETUPS


@pytest.fixture(scope="module")
def shared() -> dict:
    return {}


def _load(shared, tmp_path_factory, cache_dir, **extra):
    return load_tiny(SETUPS, shared, tmp_path_factory, FAMILY, cache_dir, **extra)


def _pil(images: torch.Tensor) -> list:
    from PIL import Image

    arrays = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arrays]


def test_ode_sampling_matches_diffusers_pipeline(shared, tmp_path_factory, tmp_path, monkeypatch):
    import diffusers

    policy = _load(shared, tmp_path_factory, tmp_path / "cache", train="frozen")
    assert conditioning_of(policy) == FAMILIES[FAMILY].conditioning == "first-frame"
    images = tiny_images(len(PROMPTS), seed=1, size=32)  # the output size: no resize on our side
    cond = encode_inputs(policy, PROMPTS, images)
    pipe = diffusers.HunyuanVideo15ImageToVideoPipeline.from_pretrained(
        str(shared[FAMILY]), text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None)
    pipe.set_progress_bar_config(disable=True)
    # the pipeline sizes its input to the checkpoint's target size (480p); ours is the output size
    monkeypatch.setattr(pipe.video_processor, "calculate_default_height_width",
                        lambda height, width, target_size: (policy.height, policy.width))
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    text = ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2")
    theirs = torch.cat([  # the pipeline takes one image for the whole batch: one call per row
        pipe(image=_pil(images)[i], **{k: cond[k][i : i + 1] for k in text}, num_frames=5, num_inference_steps=2,
             latents=x0[i : i + 1], output_type="latent", return_dict=False)[0]
        for i in range(len(PROMPTS))])
    # sampling.sigmas=diffusers computes, from the folder, the grid the pipeline just used
    from digenrl.config.model import ModelConfig
    from digenrl.config.sampling import SamplingConfig
    from digenrl.models import sampling_sigmas

    model = ModelConfig(name=FAMILY, path=str(shared[FAMILY]), height=policy.height, width=policy.width, frames=5)
    sigmas = sampling_sigmas(model, SamplingConfig(sigmas="diffusers"), 2)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    assert sigmas[1] != 0.5  # a shifted grid, not linspace

    x = x0
    with torch.no_grad():
        for i in range(2):  # its guider's scale is 1: no negative branch
            v = policy.velocity(x, sigmas[i].expand(len(PROMPTS)), cond)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    torch.testing.assert_close(x, theirs.float(), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(x, x0)


def test_rollout_lora_step_and_sync(shared, tmp_path_factory, tmp_path):
    policy = _load(shared, tmp_path_factory, tmp_path / "a", train="lora", lora_rank=4)
    cond = cond_repeat(encode_inputs(policy, PROMPTS, tiny_images(len(PROMPTS), seed=2, size=32)), GROUP)
    latents, logps = rollout(policy, cond)
    assert all(torch.isfinite(lp).all() for lp in logps[:-1]) and logps[-1] is None
    frames = policy.decode(latents[:, -1])
    assert frames.shape == (4, 5, 3, 32, 32) and 0.0 <= frames.min() and frames.max() <= 1.0
    check_lora_step_and_sync(policy, cond, latents, logps,
                             lambda: _load(shared, tmp_path_factory, tmp_path / "b", train="lora", lora_rank=4))


def test_the_first_frame_acts(shared, tmp_path_factory, tmp_path):
    policy = _load(shared, tmp_path_factory, tmp_path / "cache", train="frozen")
    a = encode_inputs(policy, PROMPTS, tiny_images(2, seed=3, size=32))
    b = encode_inputs(policy, PROMPTS, tiny_images(2, seed=4, size=32))
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        va = policy.velocity(x, sigma, a)
        for key in ("image_embeds", "first_frame_latents"):  # each of the two paths alone moves it
            assert not torch.allclose(va, policy.velocity(x, sigma, {**a, key: b[key]})), key


def test_recipe_is_the_familys_and_its_lora_targets_are_linear_layers(shared, tmp_path_factory, tmp_path):
    """recipes/hunyuan_video15_i2v_pickscore.yaml (tests/test_recipes.py validates every recipe):
    each LoRA target it lists names an nn.Linear of this family's transformer."""
    from pathlib import Path

    from digenrl.config.schema import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / "hunyuan_video15_i2v_pickscore.yaml")
    assert cfg.model.name == FAMILY and cfg.model.prompt_cache and cfg.model.lora_targets
    policy = _load(shared, tmp_path_factory, tmp_path / "cache", train="frozen")
    linear = [n for n, m in policy.module.named_modules() if isinstance(m, torch.nn.Linear)]
    for t in cfg.model.lora_targets:
        assert any(n == t or n.endswith("." + t) for n in linear), t


def test_full_finetune_step_and_fsdp_units(shared, tmp_path_factory, tmp_path):
    policy = _load(shared, tmp_path_factory, tmp_path / "cache", train="full", gradient_checkpointing=True)
    assert_blocks_are_fsdp_units(policy.module)
    cond = cond_repeat(encode_inputs(policy, PROMPTS, tiny_images(len(PROMPTS), seed=5, size=32)), GROUP)
    check_full_finetune_step(policy, cond)

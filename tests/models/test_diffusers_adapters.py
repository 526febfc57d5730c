"""Diffusers adapters on tiny random-weight pipelines (CPU, float32, no hub access).

Every family: save a whole tiny pipeline with `save_pretrained`, load it back through
`load_policy`, sample a group with Flow-GRPO's SDE recording log-probs, then one GRPO
step: the recomputed logp must equal the recorded one exactly (ratio == 1) before the
update, and the weights must move after it. Conventions (timestep scale, sign, packing)
are checked against the diffusers pipelines themselves: our ODE sampling must
reproduce the pipeline's own latents.

FLUX, SD3 and Wan run their real (tiny) text encoders with handmade tokenizers;
Qwen-Image (Qwen2.5-VL) and HunyuanVideo (Llava-Llama + CLIP) get precomputed
embeddings through the prompt cache instead (see tiny_diffusers.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.math import sde_step  # noqa: E402
from digenrl.models.diffusers_adapters import load_policy  # noqa: E402
from digenrl.models.families import FAMILIES  # noqa: E402
from digenrl.models.diffusers_adapters.packing import flux_image_ids, pack_2x2, unpack_2x2  # noqa: E402
from digenrl.models.protocol import Policy, guided_velocity  # noqa: E402
from tests.models.adapter_checks import (check_full_finetune_step, GROUP, NUM_STEPS, PROMPTS, check_lora_step_and_sync,  # noqa: E402, F401
                                         check_rollout_decode_step_and_sync, load_tiny, rollout, tiny_folder,
                                         train_step)
from tests.models.tiny_diffusers import FAMILY_SETUPS  # noqa: E402

# the prompt-only families with a tiny build here; the newer ones (tiny_diffusers_new.py) are
# tested in test_new_families.py, which also checks that every family has one or the other;
# the conditioned ones (an image per prompt) are in test_conditioned_families.py
TINY_FAMILIES = [n for n, f in FAMILIES.items() if n in FAMILY_SETUPS and not f.conditioning]

for name in ("diffusers", "transformers"):  # silence cast notices
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()


def pipeline_folder(folders: dict, tmp_path_factory, family: str) -> Path:
    return tiny_folder(FAMILY_SETUPS, folders, tmp_path_factory, family)


def load(folders, tmp_path_factory, family: str, cache_dir: Path, **extra):
    return load_tiny(FAMILY_SETUPS, folders, tmp_path_factory, family, cache_dir, **extra)




@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_rollout_train_step_and_weight_sync(family, folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="lora", lora_rank=4)
    assert isinstance(policy, Policy)
    check_rollout_decode_step_and_sync(
        policy, lambda: load(folders, tmp_path_factory, family, tmp_path / "cache", train="lora", lora_rank=4))


@pytest.mark.parametrize("family", ["sd3", "wan"])
def test_full_finetune_step(family, folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="full", gradient_checkpointing=True)
    check_full_finetune_step(policy)


def _pipeline_latents(family: str, pipe, cond, x0: torch.Tensor):
    """Run the diffusers pipeline itself for 2 deterministic steps from x0 (its own layout)."""
    common = dict(height=16, width=16, num_inference_steps=2, output_type="latent", return_dict=False)
    if family == "flux":
        return pipe(prompt=PROMPTS, latents=pack_2x2(x0), max_sequence_length=8, guidance_scale=3.5, **common)[0]
    if family == "sd3":
        return pipe(prompt=PROMPTS, latents=x0, max_sequence_length=8, guidance_scale=1.0, **common)[0]
    if family == "wan":
        return pipe(prompt=PROMPTS, latents=x0, num_frames=5, max_sequence_length=8, guidance_scale=1.0, **common)[0]
    if family == "qwen-image":
        return pipe(prompt_embeds=cond["prompt_embeds"], prompt_embeds_mask=cond["prompt_embeds_mask"],
                    latents=pack_2x2(x0), **common)[0]
    return pipe(prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled_prompt_embeds"],
                prompt_attention_mask=cond["prompt_attention_mask"], latents=x0, num_frames=5,
                guidance_scale=3.5, **common)[0]


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_ode_sampling_matches_diffusers_pipeline(family, folders, tmp_path_factory, tmp_path):
    """Timestep conversion, velocity sign, packing and guidance agree with the pipeline's own loop."""
    import diffusers

    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="frozen")
    cond = policy.encode_prompts(PROMPTS)
    no_text = {n: None for n in policy.text_components} if FAMILY_SETUPS[family][2] is not None else {}
    pipe = getattr(diffusers, policy.pipeline_class).from_pretrained(str(folders[family]), **no_text)
    pipe.set_progress_bar_config(disable=True)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    theirs = _pipeline_latents(family, pipe, cond, x0)
    sigmas = pipe.scheduler.sigmas  # what the pipeline used (its shift applied), ending in 0

    x = x0
    with torch.no_grad():
        for i in range(2):
            v = policy.velocity(x, sigmas[i].expand(len(PROMPTS)), cond)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    ours = pack_2x2(x) if family in ("flux", "qwen-image") else x
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ours, pack_2x2(x0) if family in ("flux", "qwen-image") else x0)


def test_guidance_true_cfg_and_embedded(folders, tmp_path_factory, tmp_path):
    sd3 = load(folders, tmp_path_factory, "sd3", tmp_path / "c1", train="frozen", negative_prompt="blurry")
    cond = sd3.encode_prompts(PROMPTS)
    neg = sd3.negative_cond(len(PROMPTS))
    x = torch.randn(2, *sd3.latent_shape)
    sigma = torch.full((2,), 0.6)
    with torch.no_grad():
        v_c, v_n = sd3.velocity(x, sigma, cond), sd3.velocity(x, sigma, neg)
        v_cfg = guided_velocity(sd3, x, sigma, cond, neg, scale=4.0)
        assert torch.equal(guided_velocity(sd3, x, sigma, cond, neg, scale=1.0), v_c)
    torch.testing.assert_close(v_cfg, v_n + 4.0 * (v_c - v_n), rtol=1e-5, atol=1e-5)

    flux = load(folders, tmp_path_factory, "flux", tmp_path / "c2", train="frozen", guidance_scale=2.0)
    cond = flux.encode_prompts(PROMPTS)
    assert torch.equal(cond["guidance"], torch.full((2,), 2.0))
    x = torch.randn(2, *flux.latent_shape)
    with torch.no_grad():
        v2 = flux.velocity(x, sigma, cond)
        v5 = flux.velocity(x, sigma, {**cond, "guidance": torch.full((2,), 5.0)})
    assert not torch.allclose(v2, v5)


def test_prompt_cache_round_trip(folders, tmp_path_factory, tmp_path):
    cache = tmp_path / "prompts"
    path = str(pipeline_folder(folders, tmp_path_factory, "flux"))
    opts = dict(height=16, width=16, max_sequence_length=8, train="frozen", prompt_cache_dir=str(cache))
    encoder = load_policy("flux", path, **opts)
    assert encoder.precompute_prompts(PROMPTS) == 2 and encoder.precompute_prompts(PROMPTS) == 0
    assert len(list(cache.rglob("*.safetensors"))) == 2
    direct = encoder._encode_text(PROMPTS)

    trainer = load_policy("flux", path, text_encoders=False, **opts)  # no text encoder loaded
    assert trainer.text_pipeline is None
    cached = trainer.encode_prompts(PROMPTS[::-1])
    for k in direct:
        assert torch.equal(cached[k], direct[k].flip(0)), k
    with pytest.raises(RuntimeError, match="precompute_prompts"):
        trainer.encode_prompts(["never seen"])
    # another model id is another namespace: nothing shared
    other = load_policy("flux", path, text_encoders=False, **{**opts, "model_id": "other"})
    with pytest.raises(RuntimeError, match="not found"):
        other.encode_prompts(PROMPTS[:1])


def test_packing_matches_diffusers():
    from diffusers import FluxPipeline

    x = torch.randn(2, 4, 6, 8)
    tokens = pack_2x2(x)
    assert torch.equal(tokens, FluxPipeline._pack_latents(x, 2, 4, 6, 8))
    assert torch.equal(unpack_2x2(tokens, 6, 8), x)
    # FluxPipeline._unpack_latents takes pixel sizes: latent size * vae factor (8)
    assert torch.equal(FluxPipeline._unpack_latents(tokens, 48, 64, 8), x)
    assert torch.equal(flux_image_ids(6, 8, "cpu", torch.float32),
                       FluxPipeline._prepare_latent_image_ids(2, 3, 4, "cpu", torch.float32))


def test_load_policy_aliases_and_lora_defaults(folders, tmp_path_factory, tmp_path):
    from digenrl.models.diffusers_adapters import default_lora_targets

    assert {"to_q", "to_k", "to_v", "to_out.0"} <= set(default_lora_targets("wan"))
    path = str(pipeline_folder(folders, tmp_path_factory, "wan"))
    policy = load_policy("wan", path, height=16, width=16, frames=9, prompt_cache=str(tmp_path), max_sequence_length=8)
    assert policy.latent_shape == (4, 3, 2, 2) and policy.cache is not None
    assert policy.options.train == "full" and all(p.requires_grad for p in policy.module.parameters())


def test_load_policy_errors(tmp_path):
    with pytest.raises(ValueError, match="allowed: flux, sd3, wan, qwen-image, hunyuan-video"):
        load_policy("sdxl", str(tmp_path))
    with pytest.raises(TypeError, match="unknown adapter option"):
        load_policy("flux", str(tmp_path), heigth=16)
    with pytest.raises(ValueError, match="train='rl' unknown"):
        load_policy("flux", str(tmp_path), train="rl")
    with pytest.raises(OSError, match="huggingface-cli download"):
        load_policy("flux", "no-such-org/no-such-model", local_files_only=True)


def test_model_config_text_length_and_guidance_reach_the_adapter(folders, tmp_path_factory, tmp_path):
    """model.max_sequence_length and model.guidance act through build_policy: the T5 sequence
    is that long, the prompt cache keys on it, and the embedded scale is the one set."""
    from digenrl.config.model import ModelConfig
    from digenrl.models import build_policy
    from tests.models.tiny_diffusers import build_flux

    path = str(pipeline_folder(folders, tmp_path_factory, "flux"))
    base = dict(name="flux", path=path, height=16, width=16, lora_rank=0, prompt_cache=str(tmp_path / "c"))
    default = build_policy(ModelConfig(**base))
    assert default.max_sequence_length == 512 and default.options.guidance_scale == 3.5  # the family's defaults
    policy = build_policy(ModelConfig(**base, max_sequence_length=6, guidance=6.018))
    cond = policy.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape[1] == 6  # FLUX: T5 tokens only
    assert torch.equal(cond["guidance"], torch.full((2,), 6.018))
    assert "max_seq=6" in policy.cache.namespace and policy.cache.namespace != default.cache.namespace
    assert policy.cache.key(PROMPTS[0]) != default.cache.key(PROMPTS[0])

    schnell = build_flux(tmp_path / "schnell", guidance_embeds=False)  # a FLUX without embedded guidance
    with pytest.raises(ValueError, match="model.guidance"):
        build_policy(ModelConfig(**{**base, "path": str(schnell)}, guidance=3.5))
    assert "guidance" not in build_policy(ModelConfig(**{**base, "path": str(schnell)})).encode_prompts(PROMPTS)

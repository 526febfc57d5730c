"""Cosmos-Predict2.5 text-to-world on a tiny random-weight folder (issue 28; CPU, float32, no hub).

The checks of test_more_families.py: the ODE through our velocity reproduces the diffusers
pipeline's own latents (sigma as the timestep, sign, condition/padding-mask channels, the
all-layer Qwen2.5-VL text path, latent normalisation, the pipeline's CFG form) on the sigmas
`sampling.sigmas=diffusers` computes from the folder (the released UniPC flow-Karras grid),
a Flow-GRPO rollout then a GRPO step with ratio == 1, weight sync, the default LoRA targets
landing, a full fine-tune step, one FSDP unit per transformer block, and the recipe.

Two stand-ins, test-only: torchvision is not installed here, and the transformer resizes its
(all-zero) padding mask with it, so `install_cosmos_resize_stand_in` supplies a nearest resize
to the transformer module (ours and the pipeline's forward both use it); and the REFERENCE
pipeline's `__call__` refuses to run without a safety checker (pipeline_cosmos2_5_predict.py
653-681), so it gets `PassingSafetyChecker`, which passes every prompt. Our adapter loads
neither: it never builds the pipeline.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.math import sde_step  # noqa: E402
from digenrl.models.protocol import Policy, encode_inputs, guided_velocity  # noqa: E402
from tests.models.adapter_checks import (PROMPTS, assert_blocks_are_fsdp_units, assert_lora_landed,  # noqa: E402
                                         check_full_finetune_step, check_rollout_decode_step_and_sync, load_tiny)
from tests.models.tiny_diffusers_more import COSMOS_SETUPS, install_cosmos_resize_stand_in  # noqa: E402

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()

FAMILY = "cosmos-predict2.5"
OPTS = COSMOS_SETUPS[FAMILY][1]


@pytest.fixture(scope="module", autouse=True)
def resize_stand_in():
    from diffusers.models.transformers import transformer_cosmos

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformer_cosmos, "transforms", getattr(transformer_cosmos, "transforms", None), raising=False)
        install_cosmos_resize_stand_in()  # undone with the context: other modules see diffusers as installed
        yield


def load(folders, tmp_path_factory, cache_dir, **extra):
    return load_tiny(COSMOS_SETUPS, folders, tmp_path_factory, FAMILY, cache_dir, **extra)


class PassingSafetyChecker:
    """Test-only: lets the reference pipeline run (it checks each prompt's text, and on a decoded
    video the frames; output_type="latent" decodes nothing). Passes everything."""

    def to(self, *args, **kwargs):
        return self

    def check_text_safety(self, prompt: str) -> bool:
        return True


def _reference_pipeline(folder):
    """Cosmos2_5_PredictBasePipeline built from the folder's components (from_pretrained would
    import the guardrail package the folder's model_index names)."""
    from diffusers import AutoencoderKLWan, Cosmos2_5_PredictBasePipeline, CosmosTransformer3DModel
    from diffusers import UniPCMultistepScheduler
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    pipe = Cosmos2_5_PredictBasePipeline(
        transformer=CosmosTransformer3DModel.from_pretrained(folder / "transformer"),
        vae=AutoencoderKLWan.from_pretrained(folder / "vae"),
        scheduler=UniPCMultistepScheduler.from_pretrained(folder / "scheduler"),
        text_encoder=Qwen2_5_VLForConditionalGeneration.from_pretrained(folder / "text_encoder"),
        tokenizer=AutoTokenizer.from_pretrained(folder / "tokenizer"),
        safety_checker=PassingSafetyChecker(),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("guidance", [1.0, 2.0])
def test_ode_sampling_matches_the_text_to_world_pipeline_on_its_grid(guidance, folders, tmp_path_factory, tmp_path):
    """guidance 1: no CFG (the pipeline's do_classifier_free_guidance is g > 1), and our decode of
    the final latents is the pipeline's video. guidance 2: the pipeline's `cond + g (cond - neg)` is
    our guided_velocity at scale 1 + g, negative prompt ""."""
    from digenrl.config.model import ModelConfig
    from digenrl.config.sampling import SamplingConfig
    from digenrl.models import sampling_sigmas

    policy = load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    folder = folders[FAMILY]
    pipe = _reference_pipeline(folder)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    call = dict(prompt=list(PROMPTS), negative_prompt=[""] * len(PROMPTS), height=OPTS["height"], width=OPTS["width"],
                num_frames=OPTS["num_frames"], num_inference_steps=2, guidance_scale=guidance,
                max_sequence_length=OPTS["max_sequence_length"], return_dict=False)
    theirs = pipe(latents=x0.clone(), output_type="latent", **call)[0]

    model = ModelConfig(name=FAMILY, path=str(folder), height=OPTS["height"], width=OPTS["width"])
    sigmas = sampling_sigmas(model, SamplingConfig(sigmas="diffusers"), 2)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    # the released flow-Karras grid: sigma_max 200 -> 200/201, sigma_min 0.01 -> 0.01/1.01, then 0
    torch.testing.assert_close(sigmas, torch.tensor([200 / 201, 0.01 / 1.01, 0.0]), rtol=0, atol=1e-6)

    cond = policy.encode_prompts(PROMPTS)
    assert cond["prompt_embeds"].shape == (2, OPTS["max_sequence_length"], 2 * 8)  # both text layers, concatenated
    negative = policy.negative_cond(len(PROMPTS))
    x = x0
    with torch.no_grad():
        for i in range(2):
            s = sigmas[i].expand(len(PROMPTS))
            v = guided_velocity(policy, x, s, cond, negative, scale=1.0 + guidance) if guidance > 1 else \
                policy.velocity(x, s, cond)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    assert x.shape == theirs.shape
    torch.testing.assert_close(x, theirs.float(), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(x, x0)
    if guidance == 1.0:  # decode: the pipeline's video (B, F, 3, H, W) in [0, 1] from the same latents
        video = pipe(latents=x0.clone(), output_type="pt", **call)[0]
        assert video.shape == (len(PROMPTS), OPTS["num_frames"], 3, OPTS["height"], OPTS["width"])
        torch.testing.assert_close(policy.decode(theirs), video.float(), rtol=1e-5, atol=1e-5)


def test_flow_sde_on_the_diffusers_grid_is_refused():
    """The grid starts at 0.995, where flow-sde's std sqrt(s / (1 - s)) is ~14 x noise_level."""
    from digenrl.config.errors import ConfigError
    from digenrl.config.schema import load_config

    base = [f"model.name={FAMILY}", "model.path=/m", "sampling.sigmas=diffusers"]
    with pytest.raises(ConfigError, match="sampling.sigmas") as e:
        load_config(None, base)  # the default sde is flow-sde
    assert "cosmos-predict2.5: 0.995" in str(e.value)
    assert load_config(None, [*base, "sampling.sde=dance-sde"]).sampling.sigmas == "diffusers"


def test_rollout_train_step_and_weight_sync(folders, tmp_path_factory, tmp_path):
    """Also: the default LoRA targets all land on Linear layers (peft skips unknown names silently),
    and every transformer block is an FSDP unit."""
    policy = load(folders, tmp_path_factory, tmp_path / "cache", train="lora", lora_rank=4)
    assert isinstance(policy, Policy) and policy.output == "video"
    assert_lora_landed(policy.module, policy.default_lora_targets)
    assert len(policy.module.transformer_blocks) == 2
    assert_blocks_are_fsdp_units(policy.module)
    check_rollout_decode_step_and_sync(
        policy, lambda: load(folders, tmp_path_factory, tmp_path / "cache", train="lora", lora_rank=4))


def test_full_finetune_step(folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, tmp_path / "cache", train="full", gradient_checkpointing=True)
    check_full_finetune_step(policy)


def test_conditioning_images_and_a_missing_torchvision_are_refused(folders, tmp_path_factory, tmp_path, monkeypatch):
    """Text-to-world only: an image (image-to-world) is refused; and without torchvision the load says
    so instead of every forward failing."""
    from diffusers.models.transformers import transformer_cosmos

    policy = load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    assert getattr(policy, "conditioning", None) is None
    with pytest.raises(ValueError, match="takes prompts only"):
        encode_inputs(policy, PROMPTS, torch.rand(2, 3, 32, 32))
    monkeypatch.setattr(transformer_cosmos, "transforms", None)
    with pytest.raises(ImportError, match="torchvision"):
        load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")


def test_loads_where_the_pipeline_cannot_without_the_guardrail(folders, tmp_path_factory, tmp_path):
    """The folder's model_index.json names cosmos_guardrail's CosmosSafetyChecker (not installed):
    diffusers' from_pretrained refuses the folder, our component-wise load does not."""
    import importlib.util

    from diffusers import Cosmos2_5_PredictBasePipeline

    policy = load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    assert policy.text_pipeline is not None and policy.vae is not None
    if importlib.util.find_spec("cosmos_guardrail") is None:
        with pytest.raises(ValueError, match="cosmos_guardrail"):
            Cosmos2_5_PredictBasePipeline.from_pretrained(str(folders[FAMILY]))


def test_textless_load_reads_the_prompt_cache(folders, tmp_path_factory, tmp_path):
    """text_encoders=False (a trainer): prompts come from the cache a text-encoder load filled."""
    with_text = load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    want = with_text.encode_prompts(PROMPTS)
    textless = load(folders, tmp_path_factory, tmp_path / "cache", train="frozen", text_encoders=False)
    assert textless.text_pipeline is None
    torch.testing.assert_close(textless.encode_prompts(PROMPTS), want, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="precompute_prompts"):
        textless.encode_prompts(["never cached"])


def test_recipe_is_the_familys_and_its_lora_targets_are_linear_layers(folders, tmp_path_factory, tmp_path):
    """recipes/cosmos_predict25_pickscore.yaml (tests/test_recipes.py validates every recipe) names
    this family and a prompt cache, and each of its LoRA targets (cosmos-rl's) is an nn.Linear."""
    from pathlib import Path

    from digenrl.config.schema import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / "cosmos_predict25_pickscore.yaml")
    assert cfg.model.name == FAMILY and cfg.model.prompt_cache
    assert cfg.model.lora_targets
    frozen = load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    linear = [n for n, m in frozen.module.named_modules() if isinstance(m, torch.nn.Linear)]
    for t in cfg.model.lora_targets:
        assert any(n == t or n.endswith("." + t) for n in linear), t
    lora = load(folders, tmp_path_factory, tmp_path / "cache", train="lora", lora_rank=4,
                lora_targets=tuple(cfg.model.lora_targets))
    assert_lora_landed(lora.module, cfg.model.lora_targets)

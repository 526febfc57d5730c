"""The newer diffusers families on tiny random-weight pipelines: Wan2.2 A14B (two experts),
FLUX.2 Klein, Z-Image (CPU, float32, no hub access).

The checks of test_diffusers_adapters.py for each: the ODE through our velocity reproduces
the diffusers pipeline's own latents (timestep convention, sign, packing, latent
normalisation), a Flow-GRPO rollout then a GRPO step with ratio == 1 on-policy, weight sync,
the default LoRA targets landing, a full fine-tune step. Then Wan2.2's own: per-row expert
routing and `experts` (model.experts) training one expert or both.
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
from digenrl.models.protocol import Policy, cond_repeat  # noqa: E402
from tests.models.adapter_checks import (check_full_finetune_step, PROMPTS, assert_lora_landed,  # noqa: E402
                                         check_rollout_decode_step_and_sync, load_tiny, tiny_folder)
from tests.models.tiny_diffusers import FAMILY_SETUPS  # noqa: E402
from tests.models.tiny_diffusers_new import NEW_SETUPS, WAN22_BOUNDARY, build_wan22  # noqa: E402

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()

NEW = list(NEW_SETUPS)


def folder(folders: dict, tmp_path_factory, family: str) -> Path:
    return tiny_folder(NEW_SETUPS, folders, tmp_path_factory, family)


def load(folders, tmp_path_factory, family: str, cache_dir: Path, **extra):
    return load_tiny(NEW_SETUPS, folders, tmp_path_factory, family, cache_dir, **extra)


@pytest.mark.parametrize("family", NEW)
def test_rollout_train_step_and_weight_sync(family, folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="lora", lora_rank=4)
    assert isinstance(policy, Policy)
    prefixes = ("high.", "low.") if family == "wan2.2" else ("",)
    assert_lora_landed(policy.module, policy.default_lora_targets, prefixes)
    check_rollout_decode_step_and_sync(
        policy, lambda: load(folders, tmp_path_factory, family, tmp_path / "cache", train="lora", lora_rank=4))


@pytest.mark.parametrize("family", NEW)
def test_full_finetune_step(family, folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="full", gradient_checkpointing=True)
    check_full_finetune_step(policy)


def _pipeline_latents(family: str, pipe, x0: torch.Tensor):
    """The diffusers pipeline itself, 2 deterministic steps from x0, its own text encoder, CFG
    off, in its own layout."""
    common = dict(prompt=list(PROMPTS),  # a copy: Z-Image's encode_prompt rewrites the list in place
                  max_sequence_length=NEW_SETUPS[family][1]["max_sequence_length"], latents=x0,
                  height=16, width=16, num_inference_steps=2, output_type="latent", return_dict=False)
    if family == "wan2.2":  # guidance_scale_2 defaults to guidance_scale: 1, no CFG in either expert
        return pipe(num_frames=5, guidance_scale=1.0, **common)[0]
    if family == "flux2-klein":  # CFG only when guidance_scale > 1
        return pipe(guidance_scale=1.0, **common)[0]
    return pipe(guidance_scale=0.0, **common)[0]  # z-image: CFG whenever guidance_scale > 0


@pytest.mark.parametrize("family", NEW)
def test_ode_sampling_matches_diffusers_pipeline(family, folders, tmp_path_factory, tmp_path):
    import diffusers

    policy = load(folders, tmp_path_factory, family, tmp_path / "cache", train="frozen")
    cond = policy.encode_prompts(PROMPTS)
    pipe = getattr(diffusers, policy.pipeline_class).from_pretrained(str(folders[family]))
    pipe.set_progress_bar_config(disable=True)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    theirs = _pipeline_latents(family, pipe, x0)
    sigmas = pipe.scheduler.sigmas  # what the pipeline used (its shift applied), ending in 0
    if family == "wan2.2":  # one step per expert: the routing is under test too
        assert sigmas[0] >= WAN22_BOUNDARY > sigmas[1] > 0

    x = x0
    with torch.no_grad():
        for i in range(2):
            v = policy.velocity(x, sigmas[i].expand(len(PROMPTS)), cond)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    # FLUX.2: the pipeline returns the VAE's latents (batch-norm undone, unpatchified)
    ours = policy.to_vae_latents(x) if family == "flux2-klein" else x
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(x, x0)


def test_flux2_patchify_matches_diffusers():
    from diffusers import Flux2KleinPipeline

    from digenrl.models.diffusers_adapters.flux2_klein import patchify, position_ids, unpatchify

    x = torch.randn(2, 3, 6, 8)
    assert torch.equal(patchify(x), Flux2KleinPipeline._patchify_latents(x))
    assert torch.equal(unpatchify(patchify(x)), x)
    img, txt = position_ids(2, 3, 4, 5, torch.device("cpu"))
    assert torch.equal(img, Flux2KleinPipeline._prepare_latent_ids(torch.zeros(2, 1, 3, 4)))
    assert torch.equal(txt, Flux2KleinPipeline._prepare_text_ids(torch.zeros(2, 5, 1)))


# ---- Wan2.2: two experts -----------------------------------------------------------------

def test_wan22_routes_each_row_to_its_expert(folders, tmp_path_factory, tmp_path):
    """A batch straddling the boundary: each row gets its own expert's velocity, in order."""
    policy = load(folders, tmp_path_factory, "wan2.2", tmp_path / "cache", train="frozen")
    experts = policy.module
    assert torch.equal(experts.is_high(torch.tensor([1000.0, 875.0, 874.9, 0.0])),
                       torch.tensor([True, True, False, False]))  # t >= 0.875 * 1000, as the pipeline
    cond = cond_repeat(policy.encode_prompts(PROMPTS), 2)
    x = torch.randn(4, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.95, 0.3, 0.9, 0.1])  # high, low, high, low
    text = cond["prompt_embeds"]
    with torch.no_grad():
        v = policy.velocity(x, sigma, cond)

        def alone(expert, rows):
            return expert(hidden_states=x[rows], timestep=sigma[rows] * 1000, encoder_hidden_states=text[rows],
                          return_dict=False)[0]

        high, low = [0, 2], [1, 3]
        torch.testing.assert_close(v[high], alone(experts.high, high), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v[low], alone(experts.low, low), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(v[low], alone(experts.high, low), atol=1e-3)  # the experts differ


@pytest.mark.parametrize("train", ["lora", "full"])
@pytest.mark.parametrize("experts", ["both", "high", "low"])
def test_wan22_experts_trains_only_the_chosen_expert(experts, train, folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, "wan2.2", tmp_path / "cache", train=train, lora_rank=4, experts=experts)
    chosen = {"both": {"high", "low"}, "high": {"high"}, "low": {"low"}}[experts]
    names = [n for n, p in policy.module.named_parameters() if p.requires_grad]
    assert {n.split(".")[0] for n in names} == chosen
    assert len(policy.trainable_parameters()) == len(names)
    if train == "lora":
        assert all("lora_" in n for n in names)
        assert {n.split(".")[0] for n, _ in policy.module.named_parameters() if "lora_" in n} == chosen
        assert_lora_landed(policy.module, policy.default_lora_targets, tuple(f"{e}." for e in chosen))

    # one step on a batch with a row for each expert: only the chosen expert(s) move
    cond = policy.encode_prompts(PROMPTS)
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    before = {n: p.detach().clone() for n, p in policy.module.named_parameters()}
    optimizer = torch.optim.SGD(policy.trainable_parameters(), lr=1.0)
    for _ in range(2):  # LoRA: B starts at 0, so A only moves on the second step
        optimizer.zero_grad()
        policy.velocity(x, torch.tensor([0.95, 0.3]), cond).square().mean().backward()
        optimizer.step()
    moved = {n.split(".")[0] for n, p in policy.module.named_parameters() if not torch.equal(before[n], p)}
    assert moved == chosen


def test_wan22_refusals(folders, tmp_path_factory, tmp_path):
    from digenrl.models.diffusers_adapters.wan22 import TwoExperts

    two = str(folder(folders, tmp_path_factory, "wan2.2"))
    opts = dict(height=16, width=16, num_frames=5, max_sequence_length=8, text_encoders=False,
                prompt_cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match="model.name=wan2.2"):  # Wan2.1's adapter would drop an expert
        load_policy("wan", two, **opts)
    one = build_wan22(tmp_path / "one", two=False)
    with pytest.raises(ValueError, match="model.name=wan"):
        load_policy("wan2.2", str(one), **opts)
    with pytest.raises(ValueError, match="two-expert families only"):
        load_policy("wan", str(one), experts="high", **opts)
    ti2v = build_wan22(tmp_path / "ti2v", expand_timesteps=True, two=False)
    with pytest.raises(ValueError, match="expand_timesteps"):
        load_policy("wan2.2", str(ti2v), **opts)
    with pytest.raises(ValueError, match="experts='mid' unknown; allowed: both, high, low"):
        load_policy("wan2.2", two, experts="mid", **opts)
    with pytest.raises(ValueError, match="boundary_ratio"):
        TwoExperts(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1), 1.5)


def test_wan22_model_config_experts(folders, tmp_path_factory, tmp_path):
    """model.experts reaches the adapter through build_policy (LoRA in the chosen expert only),
    and is refused, key named, for a bad value, another family, and FSDP."""
    from digenrl.config.errors import ConfigError
    from digenrl.config.model import ModelConfig
    from digenrl.config.schema import load_config
    from digenrl.models import build_policy

    path = str(folder(folders, tmp_path_factory, "wan2.2"))
    base = dict(name="wan2.2", path=path, height=16, width=16, frames=5, max_sequence_length=8,
                lora_rank=4, prompt_cache=str(tmp_path / "c"))
    policy = build_policy(ModelConfig(**base, experts="low"))
    assert {n.split(".")[0] for n, p in policy.module.named_parameters() if p.requires_grad} == {"low"}
    assert not any("lora_" in n for n, _ in policy.module.high.named_parameters())
    full = build_policy(ModelConfig(**{**base, "lora_rank": 0}, experts="high"))
    assert {n.split(".")[0] for n, p in full.module.named_parameters() if p.requires_grad} == {"high"}
    both = build_policy(ModelConfig(**base))  # "": both
    assert {n.split(".")[0] for n, p in both.module.named_parameters() if p.requires_grad} == {"high", "low"}

    with pytest.raises(ConfigError, match=r"model\.experts.*'mid' is not allowed; choose one of: both, high, low"):
        ModelConfig(**base, experts="mid")
    with pytest.raises(ConfigError, match=r"model\.experts: wan has one transformer"):
        ModelConfig(**{**base, "name": "wan"}, experts="high")
    with pytest.raises(ConfigError, match=r"runtime\.trainer\.shard: fsdp is not built for two-expert"):
        load_config(None, ["model.name=wan2.2", f"model.path={path}", "runtime.trainer.shard=fsdp"])


@pytest.mark.parametrize("family", NEW)
def test_diffusers_sigma_grid_is_refused_where_not_built(family, tmp_path):
    from digenrl.config.errors import ConfigError
    from digenrl.config.schema import load_config

    with pytest.raises(ConfigError, match=rf"sampling\.sigmas: the diffusers grid is not built for {family}"):
        load_config(None, [f"model.name={family}", f"model.path={tmp_path}", "sampling.sigmas=diffusers"])


def test_profile_knows_every_family(folders, tmp_path_factory, tmp_path):
    """`digenrl profile` reads per-family tables; FLUX.2's tokens are its latent positions."""
    from digenrl.profile.targets import diffusers_target

    policy = load(folders, tmp_path_factory, "flux2-klein", tmp_path / "cache", train="frozen")
    target = diffusers_target(policy, policy.encode_prompts(PROMPTS[:1]), "flux2-klein", None, tiny=True,
                              log=lambda _: None)
    assert policy.latent_shape == (16, 4, 4) and target.tokens == 4 * 4 + 8  # + 8 text tokens (joint)

"""Every recipe in recipes/ validates as a Config, without touching weights or reward models."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.config.model import MODEL_NAMES
from digenrl.config.schema import load_config
from digenrl.models.families import FAMILIES

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
# one recipe per diffusers family: its record's `recipe` (digenrl.models.families)
ALL_FAMILY_RECIPES = {name: f.recipe for name, f in FAMILIES.items()}
# the first five families, whose recipes follow flow_grpo and DanceGRPO (PEER_SAMPLING below)
FAMILY_RECIPES = {name: ALL_FAMILY_RECIPES[name] for name in ("flux", "sd3", "wan", "qwen-image", "hunyuan-video")}


def test_recipes_found():
    names = {p.name for p in RECIPES}
    assert {"toy_full.yaml", "toy_fast.yaml"} <= names
    assert set(ALL_FAMILY_RECIPES.values()) <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path):
    # the recipes' model and reward paths do not exist here: validating must not read them
    cfg = load_config(path)
    assert cfg.model.name in MODEL_NAMES
    # the command-line form the recipes guide shows: model.path=... overrides the recipe's
    cfg2 = load_config(path, ["model.path=/somewhere/else", "train.steps=2"])
    assert cfg2.model.path == "/somewhere/else" and cfg2.train.steps == 2


@pytest.mark.parametrize("family,recipe", sorted(ALL_FAMILY_RECIPES.items()))
def test_family_recipe_settings(family, recipe):
    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / recipe)
    assert cfg.model.name == family
    assert cfg.model.dtype == "bfloat16" and cfg.model.device == "cuda"
    assert cfg.model.path, "a hub id or placeholder the user overrides"
    assert cfg.model.prompt_cache, "diffusers recipes read prompt embeddings from a cache"
    assert "pickscore" in cfg.reward.weights and "pickscore" in cfg.reward.paths
    if FAMILIES[family].video and family != "ltx2":
        assert (cfg.model.frames - 1) % 4 == 0, "causal video VAE: frames = 4k + 1"
    if family == "ltx2":
        assert (cfg.model.frames - 1) % 8 == 0 and cfg.model.height % 32 == 0 and cfg.model.width % 32 == 0
    assert cfg.model.height % 16 == 0 and cfg.model.width % 16 == 0


@pytest.mark.parametrize("family,recipe", sorted(ALL_FAMILY_RECIPES.items()))
def test_family_recipe_roles_fit_one_h200(family, recipe):
    # what the recipes guide's tables say, as the recipe is written: a rollout worker generates a
    # micro-batch, a trainer holds the training state and backward_batch samples' activations
    from digenrl.sim.costs import CostModel, Shape

    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / recipe)
    m = cfg.model
    micro_batch = cfg.data.micro_batch_groups * cfg.data.group_size
    kw = dict(lora=m.lora_rank > 0, grad_ckpt=m.grad_ckpt, cfg=cfg.sampling.cfg_scale > 1,
              shape=Shape(m.height, m.width, m.frames or 1), lora_rank=m.lora_rank or 32)
    cost = CostModel()
    trainer = cost.fits(FAMILIES[family].checkpoint, ["trainer"], "H200",
                        train_batch=cfg.train.backward_batch or micro_batch, **kw)
    rollout = cost.fits(FAMILIES[family].checkpoint, ["rollout"], "H200", gen_batch=micro_batch, **kw)
    assert trainer.fits, f"{recipe}: trainer needs {trainer.peak_gib:.0f} GiB of {trainer.usable_gib:.0f}"
    assert rollout.fits, f"{recipe}: rollout needs {rollout.peak_gib:.0f} GiB of {rollout.usable_gib:.0f}"


@pytest.mark.parametrize("family,recipe", [(f, r) for f, r in sorted(FAMILY_RECIPES.items())
                                           if "lora_targets" in (Path(__file__).resolve().parents[1] / "recipes" / r)
                                           .read_text()])
def test_recipe_lora_targets_name_linear_layers_of_its_family(family, recipe, tmp_path):
    """A recipe that lists its own LoRA targets names, with each, at least one nn.Linear of the
    family's transformer (suffix match, as peft applies them): a target that matches nothing
    would train less than the recipe claims, silently. (The family defaults: the next test.)"""
    pytest.importorskip("diffusers")
    import torch

    from tests.models.tiny_diffusers import FAMILY_SETUPS

    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / recipe)
    targets = tuple(cfg.model.lora_targets)
    root = FAMILY_SETUPS[family][0](tmp_path / family)
    import diffusers

    cls = {"flux": "FluxTransformer2DModel", "sd3": "SD3Transformer2DModel", "wan": "WanTransformer3DModel",
           "qwen-image": "QwenImageTransformer2DModel", "hunyuan-video": "HunyuanVideoTransformer3DModel"}[family]
    module = getattr(diffusers, cls).from_pretrained(root / "transformer")
    linear = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    for t in targets:
        assert any(n == t or n.endswith("." + t) for n in linear), (recipe, t)


@pytest.mark.parametrize("family", sorted(FAMILY_RECIPES))
def test_family_default_lora_targets_name_linear_layers(family, tmp_path):
    """Each name in a family's default LoRA targets matches at least one nn.Linear of its
    transformer (peft skips a name that matches nothing, silently). The tiny config gets two
    layers: SD3's last joint block is context_pre_only and has no to_add_out, which every
    other block of the released models has. Built on the meta device: no weights."""
    pytest.importorskip("diffusers")
    import json

    import diffusers
    import torch

    from digenrl.models.diffusers_adapters import default_lora_targets, policy_class
    from tests.models.tiny_diffusers import FAMILY_SETUPS

    root = FAMILY_SETUPS[family][0](tmp_path / family)
    config = json.loads((root / "transformer" / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    config["num_layers"] = 2
    with torch.device("meta"):
        module = cls.from_config(config)
    linear = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    targets = default_lora_targets(family)
    assert targets == policy_class(family).default_lora_targets
    for t in targets:
        assert any(n == t or n.endswith("." + t) for n in linear), (family, t)


# What the peer each recipe cites samples on (issue 13): (sigma grid, text tokens, embedded guidance)
PEER_SAMPLING = {
    "sd3": ("diffusers", 128, 0.0),  # flow_grpo train_sd3.py: no sigmas, 128 T5 tokens
    "flux": ("diffusers", 128, 3.5),  # flow_grpo train_flux.py: dynamic shift, 128 T5 tokens, guidance 3.5
    "wan": ("digenrl", 512, 0.0),  # flow_grpo train_wan2_1.py: 512 UMT5 tokens (its UniPC grid: a marked deviation)
    "qwen-image": ("diffusers", 512, 0.0),  # flow_grpo qwenimage pipeline: its default 512
    "hunyuan-video": ("digenrl", 256, 6.018),  # DanceGRPO: shift(linspace(1, 0, N+1)), text_len 256, 6018
}


@pytest.mark.parametrize("family,recipe", sorted(FAMILY_RECIPES.items()))
def test_family_recipe_samples_as_its_peer(family, recipe):
    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / recipe)
    s, m = cfg.sampling, cfg.model
    assert (s.sigmas, m.max_sequence_length, m.guidance) == PEER_SAMPLING[family]


# What Flow-Factory's example samples and trains with (examples/grpo/lora/<x>.yaml, snapshot a0b2bc5):
# (num_inference_steps, our cfg_scale for its guidance_scale, noise_level, learning_rate, height)
FLOW_FACTORY = {
    "wan2.2": (10, 4.0, 0.9, 1e-4, 480),  # wan22/t2v.yaml:63, 64, 96, 77, 61 (+ guidance_scale_2 3.0)
    "wan-i2v": (10, 5.0, 0.9, 1e-4, 240),  # wan21/i2v.yaml:54, 55, 87, 66, 52
    "flux-kontext": (10, 1.0, 0.9, 3e-4, 384),  # flux1_kontext/default.yaml:53, (54: embedded 2.5), 85, 65, 51
    "qwen-image-edit": (10, 4.0, 1.0, 3e-4, 384),  # qwen_image_edit_plus/default.yaml:57, 58, 94, 69, 54
    "flux2-klein": (8, 4.0, 0.7, 3e-4, 384),  # flux2_klein_base/default.yaml:53, 54, 90, 65, 51
    "z-image": (10, 5.0, 0.7, 3e-4, 512),  # z_image/default.yaml:53, 54 (s = 1 + g), 80, 66, 52
}


@pytest.mark.parametrize("family", sorted(FLOW_FACTORY))
def test_new_family_recipe_follows_flow_factory(family):
    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / FAMILIES[family].recipe)
    s, m, t = cfg.sampling, cfg.model, cfg.train
    assert (s.num_steps, s.cfg_scale, s.noise_level, t.lr, m.height) == FLOW_FACTORY[family]
    # its shared settings: LoRA 64 / 128, clip 1e-4, no KL, one SDE step, group 16, 24 prompts per step
    assert (m.lora_rank, m.lora_alpha, t.clip_range, t.beta) == (64, 128, 1e-4, 0.0)
    assert (s.window, s.window_size, cfg.data.group_size, cfg.data.groups_per_step) == ("contiguous", 1, 16, 24)
    assert (m.guidance, s.cfg_scale_low) == ((2.5, 0.0) if family == "flux-kontext" else
                                             (0.0, 3.0) if family == "wan2.2" else (0.0, 0.0))


def test_ltx2_recipe_follows_flow_factory():
    """examples/grpo/lora/ltx2/t2av_pickscore.yaml (Flow-Factory a0b2bc5), as the recipe cites it."""
    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / "ltx2_pickscore.yaml")
    s, m, t, d = cfg.sampling, cfg.model, cfg.train, cfg.data
    assert (m.height, m.width, m.frames, m.lora_rank, m.lora_alpha) == (512, 768, 121, 64, 128)
    assert (s.num_steps, s.eval_num_steps, s.sde, s.noise_level, s.cfg_scale, s.sigmas) == (24, 50, "cps", 0.8, 1.0,
                                                                                             "diffusers")
    assert (s.window, s.window_size, d.group_size, d.groups_per_step) == ("contiguous", 3, 16, 24)
    assert (t.lr, t.weight_decay, t.clip_range, t.beta, t.max_grad_norm, cfg.reward.adv_clip) == (3e-4, 1e-4, 1e-4,
                                                                                                   0.0, 1.0, 5.0)


def test_sd35_recipe_grid_ends_as_flow_grpos():
    """The recipe's own grid (its hub id is not in this cache: the published SD3.5 scheduler
    config): flow_grpo's last noisy sigma at 10 steps, 0.0089, not our grid's 0.25."""
    pytest.importorskip("diffusers")
    from digenrl.models import sampling_sigmas

    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / "sd35_pickscore.yaml")
    sigmas = sampling_sigmas(cfg.model, cfg.sampling, cfg.sampling.num_steps)
    assert sigmas.shape == (11,) and sigmas[-2].item() == pytest.approx(0.0089, abs=5e-5)

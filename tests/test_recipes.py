"""Every recipe in recipes/ validates as a Config, without touching weights or reward models."""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.config import MODEL_NAMES, load_config

RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))
# one recipe per diffusers family (docs/models.md)
FAMILY_RECIPES = {
    "flux": "flux_pickscore.yaml",
    "sd3": "sd35_pickscore.yaml",
    "wan": "wan_pickscore.yaml",
    "qwen-image": "qwen_image_pickscore.yaml",
    "hunyuan-video": "hunyuan_video_pickscore.yaml",
}


def test_recipes_found():
    names = {p.name for p in RECIPES}
    assert {"toy_full.yaml", "toy_fast.yaml"} <= names
    assert set(FAMILY_RECIPES.values()) <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path):
    # the recipes' model and reward paths do not exist here: validating must not read them
    cfg = load_config(path)
    assert cfg.model.name in MODEL_NAMES
    # the command-line form of docs/models.md: model.path=... overrides the recipe's
    cfg2 = load_config(path, ["model.path=/somewhere/else", "train.steps=2"])
    assert cfg2.model.path == "/somewhere/else" and cfg2.train.steps == 2


@pytest.mark.parametrize("family,recipe", sorted(FAMILY_RECIPES.items()))
def test_family_recipe_settings(family, recipe):
    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / recipe)
    assert cfg.model.name == family
    assert cfg.model.dtype == "bfloat16" and cfg.model.device == "cuda"
    assert cfg.model.path, "a hub id or placeholder the user overrides"
    assert cfg.model.prompt_cache, "diffusers recipes read prompt embeddings from a cache"
    assert "pickscore" in cfg.reward.weights and "pickscore" in cfg.reward.paths
    if family in ("wan", "hunyuan-video"):
        assert (cfg.model.frames - 1) % 4 == 0, "causal video VAE: frames = 4k + 1"
    assert cfg.model.height % 16 == 0 and cfg.model.width % 16 == 0

"""Model rewards built by config name (`reward.weights` + `reward.paths`)."""

import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.rewards import build_reward
from digenrl.rewards.clip_models import ClipScore


def test_clip_score_by_name_matches_direct_construction(tiny_clip_dir, images):
    prompts = ["a red circle"] * images.shape[0]
    by_name = build_reward("clip-score", {"clip-score": tiny_clip_dir})
    direct = ClipScore(tiny_clip_dir)
    assert torch.allclose(by_name(images, prompts), direct(images, prompts))


def test_aesthetic_by_keyword_arguments(tiny_clip_dir, aesthetic_head_path, images):
    spec = f"clip_path={tiny_clip_dir}&head_path={aesthetic_head_path}"
    r = build_reward("aesthetic", {"aesthetic": spec})
    assert r(images, ["x"] * images.shape[0]).shape == (images.shape[0],)


def test_missing_path_and_unknown_name_are_named():
    with pytest.raises(ValueError, match="reward.paths.pickscore"):
        build_reward("pickscore", {})
    with pytest.raises(ValueError, match="#<served reward name>"):
        build_reward("remote", {"remote": "http://127.0.0.1:1"})
    with pytest.raises(ConfigError, match="reward.weights.pick"):
        load_config(None, ["reward.weights={pick: 1.0}"])


def test_keys_a_reward_does_not_take_are_refused_when_the_config_loads():
    # before: a TypeError when a worker built the reward; now the config names the key
    with pytest.raises(ConfigError, match="reward.paths.pickscore: unknown key.*procesor_path"):
        load_config(None, ["reward.weights={pickscore: 1.0}", "reward.paths.pickscore=path=/m&procesor_path=/p"])
    with pytest.raises(ConfigError, match="reward.paths.aesthetic: unknown key.*head"):
        load_config(None, ["reward.weights={aesthetic: 1.0}", "reward.paths.aesthetic=clip_path=/c&head=/h"])
    cfg = load_config(None, ["reward.weights={pickscore: 1.0}", "reward.paths.pickscore=path=/m&processor_path=/p"])
    assert cfg.reward.paths["pickscore"] == "path=/m&processor_path=/p"

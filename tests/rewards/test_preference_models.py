"""HPSv3 and ImageReward rewards: the optional packages are replaced by fakes that keep their API.

    hpsv3.HPSv3RewardInferencer(config_path=, checkpoint_path=, device=)
        .reward(pil_images, prompts) -> (n, 2) tensor of (mu, sigma)         (hpsv3/inference.py)
    ImageReward.load(path, device=, med_config=)
        .score(prompt, [pil, ...]) -> list of floats, or a float for one image (ImageReward.py)

The fakes score an image by its mean red value (read from the PIL image they get) plus 10 x a
number written in its prompt, so the expected reward of every sample is known in closed form,
and they record their calls so batching and ordering are checked.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.rewards import build_reward
from digenrl.rewards.preference_models import HPSv3Score, ImageRewardScore


def _fake_score(pil, prompt: str) -> float:
    assert pil.mode == "RGB"
    return float(np.asarray(pil)[..., 0].mean()) / 255 + 10 * int(prompt.split()[-1])


class FakeInferencer:
    instances: list["FakeInferencer"] = []

    def __init__(self, config_path=None, checkpoint_path=None, device="cuda", differentiable=False):
        self.args = dict(config_path=config_path, checkpoint_path=checkpoint_path, device=device)
        self.calls: list[int] = []
        FakeInferencer.instances.append(self)

    def reward(self, image_paths, prompts):
        self.calls.append(len(image_paths))
        mu = torch.tensor([_fake_score(im, p) for im, p in zip(image_paths, prompts)])
        return torch.stack([mu, torch.full_like(mu, 0.5)], dim=1).bfloat16()  # (n, 2), bf16 like the model


class FakeImageReward:
    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def score(self, prompt, image):
        self.calls.append((prompt, len(image)))
        out = [_fake_score(im, prompt) for im in image]
        return out[0] if len(out) == 1 else out  # the package squeezes a single image's score to a float


@pytest.fixture
def fake_hpsv3(monkeypatch):
    FakeInferencer.instances.clear()
    monkeypatch.setitem(sys.modules, "hpsv3", types.SimpleNamespace(HPSv3RewardInferencer=FakeInferencer))
    return FakeInferencer


@pytest.fixture
def fake_imagereward(monkeypatch):
    loads = []

    def load(name="ImageReward-v1.0", device="cpu", download_root=None, med_config=None):
        model = FakeImageReward()
        loads.append(dict(name=name, device=device, med_config=med_config, model=model))
        return model

    monkeypatch.setitem(sys.modules, "ImageReward", types.SimpleNamespace(load=load))
    return loads


def _batch(n: int):
    g = torch.Generator().manual_seed(0)
    images = torch.rand(n, 3, 6, 5, generator=g)  # (n, 3, H, W) in [0, 1]
    prompts = [f"prompt {i % 3}" for i in range(n)]  # shared prompts, interleaved
    red = torch.round(images[:, 0] * 255).mean(dim=(1, 2)) / 255  # what a uint8 PIL image keeps
    expected = red + 10 * torch.tensor([i % 3 for i in range(n)], dtype=torch.float32)
    return images, prompts, expected


def test_missing_packages_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "hpsv3", None)  # import hpsv3 -> ImportError, installed or not
    monkeypatch.setitem(sys.modules, "ImageReward", None)
    with pytest.raises(ImportError, match=r"pip install 'digenrl\[hpsv3\]'"):
        HPSv3Score("/models/HPSv3.safetensors")
    (tmp_path / "med_config.json").write_text("{}")
    with pytest.raises(ImportError, match=r"pip install 'digenrl\[imagereward\]'"):
        ImageRewardScore(str(tmp_path / "ImageReward.pt"))


def test_hpsv3_converts_tensors_batches_in_order_and_takes_mu(fake_hpsv3):
    images, prompts, expected = _batch(7)
    reward = HPSv3Score("/models/HPSv3.safetensors", config_path="/c.yaml", device="cpu", batch_size=3)
    scores = reward(images, prompts)
    assert scores.dtype == torch.float32 and scores.shape == (7,)
    assert torch.allclose(scores, expected.bfloat16().float())  # mu, through the model's bf16
    (inf,) = fake_hpsv3.instances
    assert inf.calls == [3, 3, 1]
    assert inf.args == dict(config_path="/c.yaml", checkpoint_path="/models/HPSv3.safetensors", device="cpu")


def test_imagereward_scores_each_prompt_group_once_and_puts_scores_back_in_order(fake_imagereward, tmp_path):
    (tmp_path / "med_config.json").write_text("{}")
    images, prompts, expected = _batch(7)  # prompt 0 x3, prompt 1 x2, prompt 2 x2
    reward = ImageRewardScore(str(tmp_path / "ImageReward.pt"))
    assert torch.allclose(reward(images, prompts), expected, atol=1e-6)
    (load,) = fake_imagereward
    assert load["med_config"] == str(tmp_path / "med_config.json") and load["name"] == str(tmp_path / "ImageReward.pt")
    assert load["model"].calls == [("prompt 0", 3), ("prompt 1", 2), ("prompt 2", 2)]
    one = reward(images[:1], prompts[:1])  # a single image: the package returns a float
    assert torch.allclose(one, expected[:1], atol=1e-6)


def test_videos_are_the_mean_of_frames(fake_hpsv3):
    g = torch.Generator().manual_seed(1)
    videos = torch.rand(2, 4, 3, 6, 5, generator=g)  # (B, F, 3, H, W)
    prompts = ["clip 0", "clip 1"]
    scores = HPSv3Score("/m.safetensors", batch_size=16)(videos, prompts)
    red = torch.round(videos[:, :, 0] * 255).mean(dim=(2, 3)) / 255  # (B, F)
    expected = (red + torch.tensor([[0.0], [10.0]])).bfloat16().float().mean(dim=1)  # mu per frame, bf16
    assert torch.allclose(scores, expected)


def test_built_by_name_with_the_model_device(fake_hpsv3, fake_imagereward, tmp_path):
    (tmp_path / "med_config.json").write_text("{}")
    build_reward("hpsv3", {"hpsv3": "/models/HPSv3.safetensors"}, device="cuda:1")
    assert fake_hpsv3.instances[0].args["checkpoint_path"] == "/models/HPSv3.safetensors"
    assert fake_hpsv3.instances[0].args["device"] == "cuda:1"
    r = build_reward("imagereward", {"imagereward": f"checkpoint_path={tmp_path}/ImageReward.pt&sample_frames=2"})
    assert r.name == "imagereward" and r.sample_frames == 2 and fake_imagereward[0]["device"] == "cpu"


def test_bad_arguments_are_refused_naming_the_key(fake_hpsv3, fake_imagereward, tmp_path):
    for name in ("hpsv3", "imagereward"):  # at config load, before any model
        with pytest.raises(ConfigError, match=f"reward.paths.{name}: unknown key.*batchsize"):
            load_config(None, [f"reward.weights={{{name}: 1.0}}",
                               f"reward.paths.{name}=checkpoint_path=/m&batchsize=2"])
    with pytest.raises(ValueError, match="batch_size"):
        HPSv3Score("/m.safetensors", batch_size=0)
    with pytest.raises(ValueError, match="sample_frames"):
        HPSv3Score("/m.safetensors", sample_frames=0)
    with pytest.raises(ValueError, match="med_config_path"):  # ImageReward.load would download it
        ImageRewardScore(str(tmp_path / "ImageReward.pt"))
    assert fake_hpsv3.instances == [] and fake_imagereward == []  # refused before loading

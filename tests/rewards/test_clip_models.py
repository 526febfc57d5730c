"""CLIP-family rewards on tiny random-weight checkpoints loaded from disk like real ones."""

import sys

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from digenrl.rewards.base import Reward
from digenrl.rewards.clip_models import (
    AestheticScore,
    ClipPreprocess,
    ClipScore,
    HPSv2Score,
    OCRScore,
    PickScore,
    load_aesthetic_head,
    ocr_similarity,
    ocr_target,
)
from digenrl.rewards.specs import resolve_reward

PROMPTS = ["a red cat", "a dog on grass", "a red cat", "text saying 42"]


def _features(out):  # transformers 4.x returns a tensor, 5.x a model output
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@pytest.fixture(scope="module")
def clip_score(tiny_clip_dir):
    return ClipScore(tiny_clip_dir, batch_size=3)  # 3: forces a ragged chunk on 4 images


def test_preprocess_matches_transformers_processor(tiny_clip_dir):
    """Torch preprocessing vs the PIL-based CLIPImageProcessor on a smooth uint8 image."""
    from transformers import CLIPImageProcessorPil

    g = torch.Generator().manual_seed(0)
    smooth = F.interpolate(torch.rand(1, 3, 6, 7, generator=g), size=(60, 72), mode="bilinear")
    uint8 = (smooth * 255).round().to(torch.uint8)
    pil = Image.fromarray(uint8[0].permute(1, 2, 0).numpy())
    reference = CLIPImageProcessorPil.from_pretrained(tiny_clip_dir)(images=pil, return_tensors="pt").pixel_values
    ours = ClipPreprocess.from_pretrained(tiny_clip_dir)(uint8.float() / 255)
    assert ours.shape == reference.shape == (1, 3, 32, 32)
    # PIL's and torch's antialiased bicubic differ by a few uint8 levels at most on smooth input
    assert (ours - reference).abs().mean() < 0.02 and (ours - reference).abs().max() < 0.15


def test_clip_score_shapes_range_determinism(clip_score, images):
    assert isinstance(clip_score, Reward) and clip_score.name == "clip-score"
    a, b = clip_score(images, PROMPTS), clip_score(images, PROMPTS)
    assert a.shape == (4,) and a.dtype == torch.float32 and a.device.type == "cpu"
    assert torch.equal(a, b)
    assert (a.abs() <= 1 + 1e-6).all()
    assert not clip_score.clip.model.training
    assert not any(p.requires_grad for p in clip_score.clip.model.parameters())


def test_clip_score_matches_transformers_reference(clip_score, tiny_clip_dir, images):
    """Same number as CLIPModel.get_*_features on the same pixels, computed the textbook way."""
    from transformers import AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(tiny_clip_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_clip_dir)
    pixels = ClipPreprocess.from_pretrained(tiny_clip_dir)(images)
    with torch.no_grad():
        img = F.normalize(_features(model.get_image_features(pixel_values=pixels)), dim=-1)
        ids = tok(PROMPTS, padding=True, return_tensors="pt")
        txt = F.normalize(_features(model.get_text_features(**ids)), dim=-1)
    torch.testing.assert_close(clip_score(images, PROMPTS), (img * txt).sum(-1), atol=1e-5, rtol=1e-5)


def test_batch_invariance(clip_score, images):
    batched = clip_score(images, PROMPTS)
    one_by_one = torch.cat([clip_score(images[i : i + 1], PROMPTS[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=1e-5)


def test_video_is_mean_of_frame_scores(clip_score):
    videos = torch.rand(2, 3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    prompts = ["a red cat", "a dog"]
    per_frame = clip_score(videos.flatten(0, 1), [p for p in prompts for _ in range(3)]).view(2, 3)
    torch.testing.assert_close(clip_score(videos, prompts), per_frame.mean(1), atol=1e-6, rtol=1e-6)
    sampled = ClipScore.__new__(ClipScore)
    sampled.__dict__.update(clip_score.__dict__, sample_frames=2)  # same model, frames 0 and 2
    torch.testing.assert_close(sampled(videos, prompts), per_frame[:, [0, 2]].mean(1), atol=1e-6, rtol=1e-6)


def test_pickscore_is_scaled_cosine(tiny_clip_dir, clip_score, images):
    pick = resolve_reward(f"pickscore?path={tiny_clip_dir}&processor_path={tiny_clip_dir}&batch_size=2")
    assert isinstance(pick, PickScore) and pick.name == "pickscore"
    scale = pick.clip.model.logit_scale.exp().item()  # CLIP init: 1 / 0.07
    assert scale == pytest.approx(1 / 0.07, rel=1e-4)
    torch.testing.assert_close(pick(images, PROMPTS), scale * clip_score(images, PROMPTS), atol=1e-4, rtol=1e-5)


def test_aesthetic_head_matches_manual_mlp(tiny_clip_dir, aesthetic_head_path, images):
    from safetensors.torch import load_file
    from transformers import CLIPModel

    reward = AestheticScore(tiny_clip_dir, aesthetic_head_path)
    scores = reward(images, PROMPTS)
    assert scores.shape == (4,) and reward.clip.tokenizer is None
    state = load_file(aesthetic_head_path)
    model = CLIPModel.from_pretrained(tiny_clip_dir).eval()
    with torch.no_grad():
        pixels = ClipPreprocess.from_pretrained(tiny_clip_dir)(images)
        x = F.normalize(_features(model.get_image_features(pixel_values=pixels)), dim=-1)
        for idx in (0, 2, 4, 6, 7):  # LAION v2: linear layers only, no activations
            x = x @ state[f"layers.{idx}.weight"].T + state[f"layers.{idx}.bias"]
    torch.testing.assert_close(scores, x.squeeze(-1), atol=1e-5, rtol=1e-5)
    # prompts do not matter; batch invariance
    torch.testing.assert_close(reward(images, ["x"] * 4), scores)
    one_by_one = torch.cat([reward(images[i : i + 1], ["x"]) for i in range(4)])
    torch.testing.assert_close(one_by_one, scores, atol=1e-5, rtol=1e-5)


def test_aesthetic_head_errors(tmp_path):
    from safetensors.torch import save_file

    mismatched = {"layers.0.weight": torch.zeros(8, 4), "layers.2.weight": torch.zeros(1, 5)}
    save_file(mismatched, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError, match="expects 5 inputs"):
        load_aesthetic_head(str(tmp_path / "bad.safetensors"))
    save_file({"weight": torch.zeros(2, 4)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(ValueError, match="output 1 score"):
        load_aesthetic_head(str(tmp_path / "two.safetensors"))
    save_file({"weight": torch.ones(1, 4), "bias": torch.ones(1)}, str(tmp_path / "v1.safetensors"))
    assert load_aesthetic_head(str(tmp_path / "v1.safetensors"))(torch.ones(1, 4)).item() == 5.0


def test_missing_local_model_is_clear(tmp_path):
    with pytest.raises((OSError, FileNotFoundError)):
        ClipScore(str(tmp_path / "nowhere"))


@pytest.mark.parametrize(
    "module, build, extra",
    [("hpsv2", lambda: HPSv2Score("hps.pt"), "digenrl[hpsv2]"), ("paddleocr", lambda: OCRScore(), "digenrl[ocr]")],
)
def test_missing_optional_package_names_the_extra(monkeypatch, module, build, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import of it now raises ImportError
    with pytest.raises(ImportError) as info:
        build()
    assert f"pip install {extra}" in str(info.value)


def test_ocr_similarity_by_hand():
    assert ocr_target('a sign that says "Hello World" in neon') == "Hello World"
    assert ocr_target("no quotes") == "no quotes"
    assert ocr_similarity("hello world", "Hello World") == 1.0  # case and spaces ignored
    assert ocr_similarity("helo", "hello") == pytest.approx(1 - 1 / 5)  # one deletion of five letters
    assert ocr_similarity("", "abc") == 0.0
    assert ocr_similarity("xxxxxxxxxx", "abc") == 0.0  # distance capped at the target length

"""clap (audio-text) and xclip (video-text) on tiny random-weight transformers models saved
to disk like the released ones, the torch resampler, and how AsyncRewarder hands out audio."""

import json
import math

import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.models.families import names
from digenrl.rewards import AsyncRewarder, build_reward
from digenrl.rewards.clap import ClapScore, resample_audio
from digenrl.rewards.xclip import XClipScore, video_frame_indices
from tests.helpers.tiny_clap import build_tiny_clap

PROMPTS = ["a dog barks", "rain on a roof", "a dog barks"]
AUDIO_RATE = 16_000  # not CLAP's 48 kHz: every call resamples


def _sine(freq: float, rate: int, seconds: float, phase: float = 0.0) -> torch.Tensor:
    t = torch.arange(int(rate * seconds), dtype=torch.float64) / rate
    return torch.sin(2 * math.pi * freq * t + phase)


# ---------------------------------------------------------------------------------------
# tiny checkpoints
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_clap_dir(tmp_path_factory) -> str:
    return str(build_tiny_clap(tmp_path_factory.mktemp("tiny_clap")))


@pytest.fixture(scope="module")
def clap(tiny_clap_dir) -> ClapScore:
    return ClapScore(tiny_clap_dir, batch_size=2)  # 2: a ragged chunk on 3 samples


@pytest.fixture(scope="module")
def tiny_xclip_dir(tmp_path_factory, tiny_clip_dir) -> str:
    """XCLIPModel with 4 frames, the tiny CLIP tokenizer, a VideoMAE-style image processor config."""
    from transformers import CLIPTokenizer, XCLIPConfig, XCLIPModel

    path = tmp_path_factory.mktemp("tiny_xclip")
    tokenizer = CLIPTokenizer.from_pretrained(tiny_clip_dir)
    config = XCLIPConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=24, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8, num_frames=4, mit_hidden_size=16, mit_intermediate_size=32,
                           mit_num_attention_heads=2),
        projection_dim=16, prompt_layers=2, prompt_num_attention_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    XCLIPModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    processor = {
        "image_processor_type": "VideoMAEImageProcessor", "do_resize": True, "size": {"shortest_edge": 32},
        "resample": 2, "do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.485, 0.456, 0.406],
        "image_std": [0.229, 0.224, 0.225],
    }  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return str(path)


@pytest.fixture(scope="module")
def xclip(tiny_xclip_dir) -> XClipScore:
    return XClipScore(tiny_xclip_dir, batch_size=2)


@pytest.fixture
def audio() -> torch.Tensor:
    """(3, 2, 0.5 s at 16 kHz) stereo: a 440 Hz tone, noise, a 3 kHz tone, with different channels."""
    n = AUDIO_RATE // 2
    g = torch.Generator().manual_seed(0)
    left = torch.stack([_sine(440, AUDIO_RATE, 0.5), torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1,
                        _sine(3000, AUDIO_RATE, 0.5)])
    right = torch.stack([0.5 * _sine(440, AUDIO_RATE, 0.5, 1.0), left[1].flip(0), 0.2 * left[2]])
    return (0.8 * torch.stack([left, right], dim=1)).float()


@pytest.fixture
def videos() -> torch.Tensor:
    return torch.rand(3, 7, 3, 40, 48, generator=torch.Generator().manual_seed(1))  # 7 frames: 4 are sampled


# ---------------------------------------------------------------------------------------
# resampling
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("orig, new", [(16_000, 48_000), (24_000, 48_000), (44_100, 48_000), (48_000, 16_000)])
def test_resample_keeps_a_sine(orig, new):
    """A 1 kHz sine resampled equals the same sine sampled at the new rate (edges aside), and
    its spectrum peaks at 1 kHz; the length is ceil(n * new / orig)."""
    x = _sine(1000, orig, 0.25).float()
    y = resample_audio(x[None], orig, new)[0]
    assert y.shape == (math.ceil(x.shape[0] * new / orig),) and y.dtype == torch.float32
    expected = _sine(1000, new, 0.25)[: y.shape[0]].float()
    inner = slice(new // 100, y.shape[0] - new // 100)  # 10 ms from each edge (zeros outside the signal)
    assert (y[inner] - expected[inner]).abs().max() < 2e-4  # linear interpolation: ~1e-2
    spectrum = torch.fft.rfft(y[inner].double() * torch.hann_window(y[inner].shape[0], dtype=torch.float64))
    peak_hz = spectrum.abs().argmax().item() * new / y[inner].shape[0]
    assert abs(peak_hz - 1000) < new / y[inner].shape[0]  # within one FFT bin


def test_resample_removes_what_the_new_rate_cannot_hold_and_keeps_shape():
    """Down to 16 kHz, a 12 kHz tone (above the new 8 kHz Nyquist) is filtered, not folded to 4 kHz."""
    x = _sine(12_000, 48_000, 0.25).float()
    y = resample_audio(x, 48_000, 16_000)
    assert y[200:-200].abs().max() < 1e-3
    batch = torch.rand(2, 3, 480, generator=torch.Generator().manual_seed(0))
    out = resample_audio(batch, 24_000, 48_000)
    assert out.shape == (2, 3, 960)
    torch.testing.assert_close(out[1, 2], resample_audio(batch[1, 2], 24_000, 48_000))
    assert resample_audio(batch, 48_000, 48_000) is batch


# ---------------------------------------------------------------------------------------
# clap
# ---------------------------------------------------------------------------------------


def test_clap_matches_transformers_forward(clap, tiny_clap_dir, audio):
    """The reward equals ClapModel.forward's logits_per_audio diagonal / logit_scale_a on the
    ClapFeatureExtractor's features of the same mono 48 kHz waveforms and the tokenizer's ids."""
    from transformers import AutoTokenizer, ClapFeatureExtractor, ClapModel

    images = torch.rand(3, 2, 3, 8, 8)
    scores = clap(images, PROMPTS, audio=audio, audio_rate=AUDIO_RATE)
    assert clap.name == "clap" and clap.wants_audio
    assert scores.shape == (3,) and scores.dtype == torch.float32 and (scores.abs() <= 1 + 1e-6).all()
    model = ClapModel.from_pretrained(tiny_clap_dir).eval()
    mono = resample_audio(audio.mean(dim=1), AUDIO_RATE, 48_000)
    feats = ClapFeatureExtractor.from_pretrained(tiny_clap_dir)(
        [w.double().numpy() for w in mono], sampling_rate=48_000, return_tensors="pt")
    ids = AutoTokenizer.from_pretrained(tiny_clap_dir)(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=ids.input_ids, attention_mask=ids.attention_mask,
                    input_features=feats.input_features, is_longer=feats.is_longer)
    torch.testing.assert_close(scores, out.logits_per_audio.diagonal() / model.logit_scale_a.exp(),
                               atol=1e-5, rtol=1e-5)
    # the frames do not matter; the same call gives the same numbers
    torch.testing.assert_close(clap(torch.zeros(3, 3, 8, 8), PROMPTS, audio=audio, audio_rate=AUDIO_RATE), scores)


def test_clap_depends_on_audio_and_prompt_and_is_batch_invariant(clap, audio):
    images = torch.rand(3, 3, 8, 8)
    base = clap(images, PROMPTS, audio=audio, audio_rate=AUDIO_RATE)
    # samples 0 and 2 share a prompt: a tone and another tone score differently
    assert (base[0] - base[2]).abs() > 1e-4
    other = clap(images, ["rain on a roof", "a dog barks", "xyz 42"], audio=audio, audio_rate=AUDIO_RATE)
    assert ((other - base).abs() > 1e-4).all()
    one_by_one = torch.cat([clap(images[i : i + 1], PROMPTS[i : i + 1], audio=audio[i : i + 1],
                                 audio_rate=AUDIO_RATE) for i in range(3)])
    torch.testing.assert_close(one_by_one, base, atol=1e-5, rtol=1e-5)
    # mono: the channel mean is what is scored
    mono = audio.mean(dim=1, keepdim=True)
    torch.testing.assert_close(clap(images, PROMPTS, audio=mono, audio_rate=AUDIO_RATE), base, atol=1e-5, rtol=1e-5)


def test_clap_cuts_long_audio_at_the_start_and_refuses_bad_audio(clap, audio):
    """Longer than the extractor's 1 s window: scored on its first second, every time."""
    images = torch.rand(1, 3, 8, 8)
    long = torch.rand(1, 1, int(2.5 * AUDIO_RATE), generator=torch.Generator().manual_seed(3)) * 2 - 1
    a = clap(images, ["rain"], audio=long, audio_rate=AUDIO_RATE)
    torch.testing.assert_close(clap(images, ["rain"], audio=long, audio_rate=AUDIO_RATE), a)
    first = resample_audio(long.mean(1), AUDIO_RATE, 48_000)[:, :48_000]
    torch.testing.assert_close(a, (clap.audio_embeds(first) * clap.text_embeds(["rain"])).sum(-1))
    with pytest.raises(ValueError, match=r"audio must be a float tensor \(B, channels, samples\)"):
        clap(images, ["rain"], audio=long[0], audio_rate=AUDIO_RATE)
    with pytest.raises(ValueError, match="audio_rate"):
        clap(images, ["rain"], audio=long, audio_rate=None)
    with pytest.raises(ValueError, match="got 1 samples but audio for 3"):
        clap(images, ["rain"], audio=audio, audio_rate=AUDIO_RATE)


# ---------------------------------------------------------------------------------------
# xclip
# ---------------------------------------------------------------------------------------


def test_video_frame_indices():
    assert video_frame_indices(7, 4).tolist() == [0, 2, 4, 6]
    assert video_frame_indices(4, 4).tolist() == [0, 1, 2, 3]
    assert video_frame_indices(2, 4).tolist() == [0, 0, 1, 1]  # repeated: the model takes exactly 4


def test_xclip_matches_transformers_forward(xclip, tiny_xclip_dir, videos):
    """The reward equals XCLIPModel.forward's logits_per_video diagonal / logit_scale on the
    same sampled, preprocessed frames (forward scores every video against every prompt)."""
    from transformers import AutoTokenizer, XCLIPModel

    scores = xclip(videos, PROMPTS)
    assert xclip.name == "xclip" and not getattr(xclip, "wants_audio", False)
    assert scores.shape == (3,) and scores.dtype == torch.float32 and (scores.abs() <= 1 + 1e-6).all()
    model = XCLIPModel.from_pretrained(tiny_xclip_dir).eval()
    pixels = xclip.preprocess(videos[:, [0, 2, 4, 6]].flatten(0, 1)).view(3, 4, 3, 32, 32)
    ids = AutoTokenizer.from_pretrained(tiny_xclip_dir)(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=ids.input_ids, attention_mask=ids.attention_mask, pixel_values=pixels)
    torch.testing.assert_close(scores, out.logits_per_video.diagonal() / model.logit_scale.exp(),
                               atol=1e-5, rtol=1e-5)


def test_xclip_depends_on_frames_and_prompt_and_is_batch_invariant(xclip, videos):
    base = xclip(videos, PROMPTS)
    changed = videos.clone()
    changed[:, 2] = 1.0 - changed[:, 2]  # a sampled frame (index 2) changes
    assert ((xclip(changed, PROMPTS) - base).abs() > 1e-5).all()
    unsampled = videos.clone()
    unsampled[:, 3] = 0.0  # frame 3 is not among the 4 sampled of 7
    torch.testing.assert_close(xclip(unsampled, PROMPTS), base)
    other = xclip(videos, ["rain on a roof", "a dog barks", "xyz 42"])
    assert ((other - base).abs() > 1e-5).all()
    one_by_one = torch.cat([xclip(videos[i : i + 1], PROMPTS[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(one_by_one, base, atol=1e-5, rtol=1e-5)


def test_xclip_refuses_images(xclip):
    with pytest.raises(ValueError, match="xclip scores videos"):
        xclip(torch.rand(2, 3, 32, 32), ["a", "b"])


# ---------------------------------------------------------------------------------------
# by name, AsyncRewarder, config
# ---------------------------------------------------------------------------------------


def test_built_by_name_from_a_bare_folder(tiny_clap_dir, tiny_xclip_dir, clap, xclip, audio, videos):
    by_name = build_reward("clap", {"clap": tiny_clap_dir})
    assert isinstance(by_name, ClapScore)
    images = torch.rand(3, 3, 8, 8)
    torch.testing.assert_close(by_name(images, PROMPTS, audio=audio, audio_rate=AUDIO_RATE),
                               clap(images, PROMPTS, audio=audio, audio_rate=AUDIO_RATE))
    x = build_reward("xclip", {"xclip": f"path={tiny_xclip_dir}&batch_size=1"})
    assert isinstance(x, XClipScore) and x.batch_size == 1
    torch.testing.assert_close(x(videos, PROMPTS), xclip(videos, PROMPTS), atol=1e-5, rtol=1e-5)


def test_only_rewards_that_want_audio_get_it(clap, audio):
    seen = {}

    def plain(images, prompts):  # a reward of the usual protocol: two arguments only
        seen["plain"] = True
        return images.flatten(1).mean(dim=1)

    rewarder = AsyncRewarder({"plain": plain, "clap": clap}, {"plain": 1.0, "clap": 2.0}, threads=1)
    images = torch.full((3, 2, 3, 8, 8), 0.25)
    total, parts = rewarder.submit(images, PROMPTS, None, None, audio=audio, audio_rate=AUDIO_RATE).result()
    torch.testing.assert_close(parts["clap"], clap(images, PROMPTS, audio=audio, audio_rate=AUDIO_RATE))
    torch.testing.assert_close(total, parts["plain"] + 2.0 * parts["clap"])
    assert seen["plain"]
    # the positional call of the trainer still works, and names the reward that needs audio
    with pytest.raises(ValueError, match="reward 'clap' scores the generated audio, but this run passed no audio"):
        rewarder.score(images, PROMPTS, None, None, "sum")
    with pytest.raises(ValueError, match="no audio_rate"):
        rewarder.score(images, PROMPTS, audio=audio)
    rewarder.close()
    plain_only = AsyncRewarder({"plain": plain}, {"plain": 1.0}, threads=1)
    total, _ = plain_only.score(images, PROMPTS, audio=audio, audio_rate=AUDIO_RATE)  # ignored, not an error
    torch.testing.assert_close(total, torch.full((3,), 0.25))
    plain_only.close()


def test_config_refuses_clap_without_an_audio_family():
    assert names(audio=True) == ("ltx2",)
    with pytest.raises(ConfigError, match=r"reward.weights.clap: scores the generated audio; tiny-dit generates none"):
        load_config(None, ["reward.weights={clap: 1.0}", "reward.paths.clap=/models/clap"])
    with pytest.raises(ConfigError, match=r"reward.paths.xclip: unknown key.*frames"):
        load_config(None, ["model.name=wan", "model.path=/models/wan", "reward.weights={xclip: 1.0}",
                           "reward.paths.xclip=path=/m&frames=8"])
    cfg = load_config(None, ["model.name=wan", "model.path=/models/wan", "reward.weights={xclip: 1.0}",
                             "reward.paths.xclip=/models/xclip"])
    assert cfg.reward.paths["xclip"] == "/models/xclip"


def test_a_reward_server_carries_no_audio_so_audio_rewards_are_refused_there(tiny_clap_dir):
    """The reward server's requests hold images and prompts: serving clap (or source-similarity)
    is refused when the server starts, before Ray, and so is a config that names one as remote."""
    from digenrl.runtime.serving.reward_server import RewardServer

    for spec in (f"clap?path={tiny_clap_dir}", "digenrl.rewards.source:SourceSimilarity"):
        with pytest.raises(ValueError, match="requests do not carry"):
            RewardServer(spec).start()
    with pytest.raises(ValueError, match="requests do not carry"):
        RewardServer(ClapScore(tiny_clap_dir)).start()
    for served in ("clap", "source-similarity"):
        with pytest.raises(ConfigError, match=f"reward.paths.remote: #{served} scores"):
            load_config(None, ["reward.weights={remote: 1.0}", f"reward.paths.remote=http://h:8000#{served}"])


def test_config_refuses_xclip_for_an_image_family():
    for name in ("flux", "tiny-dit"):
        with pytest.raises(ConfigError, match=f"reward.weights.xclip: scores videos; {name} generates images"):
            load_config(None, [f"model.name={name}", "model.path=/models/m", "reward.weights={xclip: 1.0}",
                               "reward.paths.xclip=/x"])

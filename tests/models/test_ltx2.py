"""LTX-2 (video + audio) on a tiny random-weight pipeline (tiny_diffusers_more.build_ltx2: 32x32
pixels, 5 frames at 24 fps, 5 audio latents; CPU, float32; its own Gemma-3 + text connectors):
- two ODE steps through our velocity reproduce LTX2Pipeline's own video AND audio latents
  (output_type="latent"), on the sigmas `sampling.sigmas=diffusers` computes;
- classifier-free guidance (one scale for both streams) reproduces the pipeline's;
- the decoded frames and the waveform (`decode_audio`) equal the pipeline's own outputs;
- a rollout + LoRA step with ratio == 1 + weight sync, the default LoRA targets landing, a full
  fine-tune step, and every transformer block an FSDP unit;
- the audio stream is part of the trajectory: changing only the audio tokens changes the video
  velocity (cross-modal attention) and the audio velocity.

The pipeline is called with its extra guidance terms off (guidance_scale, audio_guidance_scale and
the modality scales 1, STG scales 0, rescales 0; see ltx2.py's docstring for what is not
reproduced), and with our initial noise handed over as its `latents` / `audio_latents`: it
normalises what it is given (`_normalize_latents`, `_normalize_audio_latents`), so we pass the
denormalised, unpacked form (`policy.unpacked_latents`), which it maps back to our noise.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.math import sde_step  # noqa: E402
from digenrl.models.protocol import Policy  # noqa: E402
from tests.models.adapter_checks import (  # noqa: E402
    PROMPTS, assert_blocks_are_fsdp_units, assert_lora_landed, check_full_finetune_step,
    check_rollout_decode_step_and_sync, load_tiny,
)
from tests.models.tiny_diffusers_more import AUDIO_SETUPS  # noqa: E402

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)

FAMILY = "ltx2"
SETUPS = AUDIO_SETUPS
PIPELINE_OFF = dict(guidance_scale=1.0, stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0,
                    audio_guidance_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0,
                    audio_guidance_rescale=0.0, frame_rate=24.0)


def _load(folders, tmp_path_factory, cache_dir, **extra):
    return load_tiny(SETUPS, folders, tmp_path_factory, FAMILY, cache_dir, **extra)


def _pipeline(folder):
    import diffusers

    pipe = diffusers.LTX2Pipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _pipeline_call(pipe, policy, x0, output_type):
    video, audio = policy.unpacked_latents(x0)
    return pipe(prompt=list(PROMPTS), height=policy.height, width=policy.width, num_frames=policy.num_frames,
                num_inference_steps=2, max_sequence_length=policy.max_sequence_length, latents=video,
                audio_latents=audio, output_type=output_type, return_dict=False, **PIPELINE_OFF)


def _ode(policy, x0, sigmas, cond):
    x = x0
    with torch.no_grad():
        for i in range(2):
            v = policy.velocity(x, sigmas[i].expand(len(x0)), cond)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    return x


def test_ode_sampling_matches_diffusers_pipeline_video_and_audio(folders, tmp_path_factory, tmp_path):
    from digenrl.config.model import ModelConfig
    from digenrl.config.sampling import SamplingConfig
    from digenrl.models import sampling_sigmas

    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    assert isinstance(policy, Policy) and policy.audio_sample_rate == 16000
    # flat layout: 3 x 16 x 16 video tokens of 4 channels, then 5 audio tokens of 2 x 2
    assert policy.latent_shape == (3 * 16 * 16 * 4 + 5 * 4,)
    cond = policy.encode_prompts(PROMPTS)
    pipe = _pipeline(folders[FAMILY])
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    video, audio = _pipeline_call(pipe, policy, x0, "latent")  # denormalised (B, C, F, H, W), (B, C, L, M)
    assert video.shape == (2, 4, 3, 16, 16) and audio.shape == (2, 2, 5, 2)

    model = ModelConfig(name=FAMILY, path=str(folders[FAMILY]), height=32, width=32, frames=5)
    sigmas = sampling_sigmas(model, SamplingConfig(sigmas="diffusers"), 2)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    assert sigmas[1] != 0.5  # a shifted grid, not linspace

    x = _ode(policy, x0, sigmas, cond)
    ours_video, ours_audio = policy.unpacked_latents(x)
    torch.testing.assert_close(ours_video, video.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours_audio, audio.float(), rtol=1e-4, atol=1e-4)
    # both streams moved
    start_video, start_audio = policy.split(x0)
    end_video, end_audio = policy.split(x)
    assert not torch.allclose(start_video, end_video) and not torch.allclose(start_audio, end_audio)
    # the layout round-trips
    torch.testing.assert_close(policy.packed_latents(ours_video, ours_audio), x, rtol=1e-5, atol=1e-5)


def test_cfg_matches_the_pipelines_x0_space_guidance(folders, tmp_path_factory, tmp_path):
    """The pipeline guides in x0 space (x0_c + (s - 1)(x0_c - x0_u)); with one scale for both
    streams that is our guided_velocity on the negative prompt "" (the adapter's default)."""
    from digenrl.models.protocol import guided_velocity

    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    pipe = _pipeline(folders[FAMILY])
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(5))
    video, audio = policy.unpacked_latents(x0)
    guided = {**PIPELINE_OFF, "guidance_scale": 3.0, "audio_guidance_scale": 3.0}
    theirs = pipe(prompt=list(PROMPTS), negative_prompt="", height=32, width=32, num_frames=5, num_inference_steps=2,
                  max_sequence_length=8, latents=video, audio_latents=audio, output_type="latent", return_dict=False,
                  **guided)
    sigmas = pipe.scheduler.sigmas.float()
    cond, negative = policy.encode_prompts(PROMPTS), policy.negative_cond(len(PROMPTS))
    x = x0
    with torch.no_grad():
        for i in range(2):
            v = guided_velocity(policy, x, sigmas[i].expand(len(x0)), cond, negative, 3.0)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    for ours, ref in zip(policy.unpacked_latents(x), theirs):
        torch.testing.assert_close(ours, ref.float(), rtol=1e-4, atol=1e-4)


def test_decode_and_decode_audio_equal_the_pipelines_outputs(folders, tmp_path_factory, tmp_path):
    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    pipe = _pipeline(folders[FAMILY])
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(4))
    frames, wave = _pipeline_call(pipe, policy, x0, "pt")  # (B, F, 3, H, W) in [0, 1]; (B, channels, samples)
    x = _ode(policy, x0, pipe.scheduler.sigmas.float(), policy.encode_prompts(PROMPTS))
    ours = policy.decode(x)
    assert ours.shape == frames.shape == (2, 5, 3, 32, 32)
    torch.testing.assert_close(ours, frames.float(), rtol=1e-3, atol=1e-3)
    audio = policy.decode_audio(x)
    channels = pipe.vocoder.config.out_channels
    assert audio.dtype == torch.float32 and audio.shape[:2] == (2, channels) == wave.shape[:2]
    assert audio.shape == wave.shape and audio.abs().max() <= 1.0
    torch.testing.assert_close(audio, wave.float(), rtol=1e-3, atol=1e-3)
    assert policy.audio_sample_rate == pipe.vocoder.config.output_sampling_rate


def test_audio_tokens_act_on_both_streams(folders, tmp_path_factory, tmp_path):
    """The audio half of the trajectory latent is a real input: changing only it moves the video
    velocity too (audio-to-video attention), so the joint log-prob is not two independent ones."""
    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    cond = policy.encode_prompts(PROMPTS)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *policy.latent_shape, generator=g)
    video, audio = policy.split(x)
    y = policy.join(video, torch.randn(audio.shape, generator=g))
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        vx, vy = policy.split(policy.velocity(x, sigma, cond)), policy.split(policy.velocity(y, sigma, cond))
    assert not torch.allclose(vx[0], vy[0], atol=1e-5) and not torch.allclose(vx[1], vy[1], atol=1e-5)


def test_rollout_train_step_and_weight_sync(folders, tmp_path_factory, tmp_path):
    """The default LoRA targets all land (each names a real Linear), every block is an FSDP unit,
    then the shared rollout / decode / LoRA step (ratio == 1) / weight sync check."""
    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="lora", lora_rank=4)
    assert_lora_landed(policy.module, policy.default_lora_targets)
    assert len(policy.module.transformer_blocks) == 2
    assert_blocks_are_fsdp_units(policy.module)
    check_rollout_decode_step_and_sync(
        policy, lambda: _load(folders, tmp_path_factory, tmp_path / "cache", train="lora", lora_rank=4))


def test_full_finetune_step(folders, tmp_path_factory, tmp_path):
    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="full", gradient_checkpointing=True)
    check_full_finetune_step(policy)


def test_rollout_carries_the_audio_track(folders, tmp_path_factory, tmp_path):
    """sampler.finish fills Trajectories.audio (the policy's decode_audio) and audio_rate; shards
    split and concatenate it with the rows; audio_kwargs hands it to a rewarder, and nothing for a
    trajectory without audio."""
    from digenrl.math import sigma_schedule
    from digenrl.models.protocol import has_audio
    from digenrl.rollout import SampleSpec, audio_kwargs, generate
    from digenrl.runtime.shards import concat_trajectories, select_rows

    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="frozen")
    assert has_audio(policy)
    spec = SampleSpec(sigmas=sigma_schedule(2, shift=3.0), sde_steps=(0,))
    coords = [(0, 0, 0), (0, 0, 1)]
    traj = generate(policy, [PROMPTS[0]] * 2, coords, spec, step=0, version=0)
    assert traj.audio.shape == (2, 2, 68) and traj.audio_rate == 16000 and traj.images.shape == (2, 5, 3, 32, 32)
    torch.testing.assert_close(traj.audio, policy.decode_audio(traj.latents[:, -1]))
    assert torch.isfinite(traj.log_probs[:, 0]).all()
    again = concat_trajectories([select_rows(traj, 0, 1), select_rows(traj, 1, 2)])
    assert torch.equal(again.audio, traj.audio) and again.audio_rate == 16000
    kw = audio_kwargs(traj)
    assert kw["audio_rate"] == 16000 and kw["audio"] is traj.audio
    traj.audio = None
    assert audio_kwargs(traj) == {}


def test_recipe_lora_targets_are_linear_layers(folders, tmp_path_factory, tmp_path):
    """recipes/ltx2_pickscore.yaml's targets (Flow-Factory's 28 Linear layers per block) all land."""
    from pathlib import Path

    from digenrl.config.schema import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "recipes" / "ltx2_pickscore.yaml")
    policy = _load(folders, tmp_path_factory, tmp_path / "cache", train="lora", lora_rank=4,
                   lora_targets=tuple(cfg.model.lora_targets))
    assert_lora_landed(policy.module, cfg.model.lora_targets)
    adapted = [n for n, _ in policy.module.named_parameters() if n.endswith(".lora_A.default.weight")]
    assert len(adapted) == 28 * len(policy.module.transformer_blocks)

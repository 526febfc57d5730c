"""LTX-2 text-to-audio+video (LTX2VideoTransformer3DModel): one trajectory latent holding a video
stream and an audio stream, Gemma-3 text through LTX-2's text connectors.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/ltx2/pipeline_ltx2.py:
- two streams, one transformer call: `noise_pred_video, noise_pred_audio = self.transformer(
  hidden_states=video tokens, audio_hidden_states=audio tokens, ...)` (1415-1437); each stream
  has its own (identical) Euler scheduler (1354, 1593-1596).
- timestep: `timestep = t.expand(B)` (1412) with t = sigma * 1000 from the scheduler, passed as
  `timestep` and as `sigma` (1421: the LTX-2.3 cross-attention modulation input), `use_cross_timestep`
  True (the pipeline's default). Audio uses the same timestep. So the model input is sigma * 1000.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0. The
  pipeline turns it into x0 and back (`convert_velocity_to_x0` / `convert_x0_to_velocity`,
  851-867, 1441-1590); without guidance that is the identity up to float rounding.
- video packing: `_pack_latents` (651): (B, C, F, H, W) -> (B, F/pt * H/p * W/p, C * pt * p * p),
  token (f, h, w) holding channels [c, dt, dy, dx]. Normalisation (`_normalize_latents`, 687):
  (z - latents_mean) * scaling_factor / latents_std per channel, on the unpacked latents; the
  pipeline denoises the normalised tokens and denormalises after unpacking (1614-1621, then
  1629-1631 or 1654-1656).
- audio packing: `_pack_audio_latents` without patch sizes (727, called so at 848): (B, C, L, M)
  -> (B, L, C * M). Normalisation (`_normalize_audio_latents`, 707): (z - mean) / std over the
  packed C * M features (the audio VAE's latents_mean has base_channels = C * M entries); the
  pipeline denormalises the packed tokens then unpacks (1623-1626).
- audio length: duration_s = num_frames / frame_rate; latents per second = audio VAE sample_rate /
  mel_hop_length / audio temporal compression (4); audio_num_frames = round(duration_s * that)
  (1306-1310). The frame rate is the pipeline's default, 24 (not an option here); the
  transformer's RoPE gets fps = frame_rate / motion_speed (motion_speed 1).
- text: Gemma-3 hidden states of every layer, stacked and flattened (`_get_gemma_prompt_embeds`,
  303-365: left padding to max_sequence_length, a mask), then `self.connectors(embeds, mask,
  padding_side)` (1251-1253; LTX2TextConnectors.forward,
  src/diffusers/pipelines/ltx2/connectors.py:399-478) giving the video and audio prompt
  embeddings and a binary mask that goes to both streams' cross attention. The connectors are
  frozen and depend on the prompt only, so they run here with the text encoder: the Cond (and
  the prompt cache) holds their outputs, `prompt_embeds`, `audio_prompt_embeds`,
  `prompt_attention_mask`.
- CFG: the pipeline guides in x0 space with a delta, x0_c + (s - 1)(x0_c - x0_u) (1441-1457, 1570-1571);
  x0 = x - sigma v is affine in v, so that is v_u + s (v_c - v_u), our `guided_velocity` form,
  sampling.cfg_scale = guidance_scale, for both streams. Not reproduced: a separate
  audio_guidance_scale (default 7), spatio-temporal guidance (stg_scale, default 1), modality
  isolation guidance (modality_scale, default 3) and guidance_rescale (default 0.7): the
  equivalence test turns them off in the pipeline.
- decode: video `_denormalize_latents` then `vae.decode(latents, timestep)` with timestep 0 when
  the VAE is timestep-conditioned (decode_timestep 0, decode_noise_scale 0: no noise) (1637-1659);
  audio `audio_vae.decode(latents)` -> mel spectrogram -> `vocoder(mel)` -> (B, channels, samples)
  (1662-1664), at vocoder.config.output_sampling_rate.

Trajectory latent layout (per sample, flat): [video tokens (Lv, Dv) flattened row-major, then
audio tokens (La, Da) flattened], both in the pipeline's normalised packed space; latent_shape is
(Lv * Dv + La * Da,). The SDE noise and log-prob therefore cover both streams; `split` undoes it.
Sequence parallelism is not built for this family.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy, cast_module
from digenrl.models.protocol import Cond

FRAME_RATE = 24.0  # LTX2Pipeline.__call__'s default frame_rate


class LTX2Policy(DiffusersPolicy):
    family = "ltx2"
    pipeline_class = "LTX2Pipeline"
    text_components = ("text_encoder", "tokenizer", "connectors")
    default_size = (512, 768)  # the pipeline's defaults
    default_num_frames = 121
    default_max_sequence_length = 1024
    # every attention of a block (video/audio self, text cross, audio<->video cross) has
    # to_q/to_k/to_v/to_out.0 (transformer_ltx2.py LTX2Attention)
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    frame_rate = FRAME_RATE

    def __init__(self, transformer: torch.nn.Module, vae: Optional[torch.nn.Module] = None,
                 text_modules: Optional[dict[str, Any]] = None, condition_modules: Optional[dict[str, Any]] = None,
                 audio_vae: Optional[torch.nn.Module] = None, vocoder: Optional[torch.nn.Module] = None,
                 **options: Any):
        self.audio_vae = audio_vae
        super().__init__(transformer, vae, text_modules=text_modules, condition_modules=condition_modules, **options)
        if audio_vae is not None:
            cast_module(audio_vae, self.device, self.vae_dtype).eval().requires_grad_(False)
        self.vocoder = None
        if vocoder is not None:
            self.vocoder = cast_module(vocoder, self.device, self.vae_dtype).eval().requires_grad_(False)
        # the waveform's rate (Hz): rewards and writers test `audio_sample_rate` for "has audio"
        self.audio_sample_rate: Optional[int] = (
            int(self.vocoder.config.output_sampling_rate) if self.vocoder is not None else None)

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        return cls(pipe.transformer, pipe.vae, text_modules=text_modules, condition_modules=condition_modules,
                   audio_vae=pipe.audio_vae, vocoder=pipe.vocoder, **options)

    def _build_text_pipeline(self, text_modules: dict[str, Any]) -> Any:
        import diffusers

        self._prepare_text_modules(text_modules)
        full = {name: text_modules.get(name) for name in self.text_components}
        return diffusers.LTX2Pipeline(transformer=None, vae=None, scheduler=None, audio_vae=None, vocoder=None, **full)

    # ---- geometry ----------------------------------------------------------------------

    def _latent_shape(self) -> tuple[int, ...]:
        cfg = self.module.config
        if self.vae is not None:
            s, t = self.vae.spatial_compression_ratio, self.vae.temporal_compression_ratio
        else:
            s, t = 32, 8  # LTX2Pipeline's fallbacks without a VAE
        p, pt = cfg.patch_size, cfg.patch_size_t
        if (self.num_frames - 1) % t or ((self.num_frames - 1) // t + 1) % pt:
            raise ValueError(f"ltx2: num_frames - 1 must be a multiple of {t}, got num_frames={self.num_frames}")
        if self.height % max(32, s * p) or self.width % max(32, s * p):
            raise ValueError(f"ltx2: height and width must be multiples of {max(32, s * p)} (LTX2Pipeline.check_inputs)"
                             f", got {self.height}x{self.width}")
        self.video_grid = ((self.num_frames - 1) // t + 1, self.height // s, self.width // s)  # latent F, H, W
        f, h, w = self.video_grid
        self.video_tokens = (f // pt) * (h // p) * (w // p)
        self.video_dim = cfg.in_channels  # = latent channels * pt * p * p (proj_in's input)
        if self.audio_vae is not None:
            a = self.audio_vae.config
            rate, hop = a.sample_rate, a.mel_hop_length
            at, am = self.audio_vae.temporal_compression_ratio, self.audio_vae.mel_compression_ratio
            self.audio_channels, self.audio_mel = a.latent_channels, a.mel_bins // am
        else:  # the pipeline's fallbacks without an audio VAE
            rate, hop, at = 16000, 160, 4
            self.audio_channels, self.audio_mel = 8, 64 // 4
        duration = self.num_frames / self.frame_rate
        self.audio_tokens = round(duration * rate / hop / float(at))  # pipeline_ltx2.py:1306-1310
        self.audio_dim = self.audio_channels * self.audio_mel
        if self.audio_dim != cfg.audio_in_channels:
            raise ValueError(f"ltx2: the audio VAE's packed width {self.audio_dim} differs from the transformer's "
                             f"audio_in_channels {cfg.audio_in_channels}")
        return (self.video_tokens * self.video_dim + self.audio_tokens * self.audio_dim,)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N) trajectory latents -> normalised packed (video (B, Lv, Dv), audio (B, La, Da))."""
        n = self.video_tokens * self.video_dim
        b = x.shape[0]
        return x[:, :n].reshape(b, self.video_tokens, self.video_dim), x[:, n:].reshape(b, self.audio_tokens, self.audio_dim)

    def join(self, video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """The inverse of `split`: packed normalised streams -> (B, N)."""
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    def unpacked_latents(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N) -> the VAEs' inputs: video (B, C, F, H, W) and audio (B, C, L, M), denormalised
        (what LTX2Pipeline returns with output_type="latent")."""
        from diffusers import LTX2Pipeline

        video, audio = self.split(x)
        f, h, w = self.video_grid
        cfg = self.module.config
        video = LTX2Pipeline._unpack_latents(video, f // cfg.patch_size_t, h // cfg.patch_size, w // cfg.patch_size,
                                             cfg.patch_size, cfg.patch_size_t)
        if self.vae is not None:
            video = LTX2Pipeline._denormalize_latents(video, self.vae.latents_mean, self.vae.latents_std,
                                                      self.vae.config.scaling_factor)
        if self.audio_vae is not None:
            audio = LTX2Pipeline._denormalize_audio_latents(audio, self.audio_vae.latents_mean,
                                                            self.audio_vae.latents_std)
        audio = LTX2Pipeline._unpack_audio_latents(audio, self.audio_tokens, num_mel_bins=self.audio_mel)
        return video, audio

    def packed_latents(self, video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """The inverse of `unpacked_latents`: denormalised (B, C, F, H, W), (B, C, L, M) -> (B, N)."""
        from diffusers import LTX2Pipeline

        cfg = self.module.config
        if self.vae is not None:
            video = LTX2Pipeline._normalize_latents(video, self.vae.latents_mean, self.vae.latents_std,
                                                    self.vae.config.scaling_factor)
        video = LTX2Pipeline._pack_latents(video, cfg.patch_size, cfg.patch_size_t)
        audio = LTX2Pipeline._pack_audio_latents(audio)
        if self.audio_vae is not None:
            audio = LTX2Pipeline._normalize_audio_latents(audio, self.audio_vae.latents_mean, self.audio_vae.latents_std)
        return self.join(video, audio)

    # ---- text ----------------------------------------------------------------------------

    def _encode_text(self, prompts: list[str]) -> Cond:
        pipe = self.text_pipeline
        embeds, mask = pipe._get_gemma_prompt_embeds(prompt=prompts, max_sequence_length=self.max_sequence_length,
                                                     device=self.device)
        side = getattr(pipe.tokenizer, "padding_side", "left") if pipe.tokenizer is not None else "left"
        connectors = pipe.connectors
        embeds = embeds.to(connectors.dtype)
        video, audio, mask = connectors(embeds, mask, padding_side=side)
        return {"prompt_embeds": video, "audio_prompt_embeds": audio, "prompt_attention_mask": mask}

    # ---- the velocity field --------------------------------------------------------------

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        video, audio = self.split(x)
        f, h, w = self.video_grid
        t = sigma * 1000.0  # LTX-2's input is sigma * 1000 (see module docstring)
        mask = cond["prompt_attention_mask"]
        v_video, v_audio = self.module(
            hidden_states=video,
            audio_hidden_states=audio,
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            audio_encoder_hidden_states=cond["audio_prompt_embeds"].to(self.dtype),
            timestep=t,
            sigma=t,
            encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask,
            num_frames=f, height=h, width=w, fps=self.frame_rate,
            audio_num_frames=self.audio_tokens,
            use_cross_timestep=True,
            return_dict=False,
        )
        return self.join(v_video, v_audio)

    # ---- decoding --------------------------------------------------------------------

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        video, _ = self.unpacked_latents(latents)
        timestep = None
        if self.vae.config.timestep_conditioning:  # decode_timestep 0, decode_noise_scale 0: no noise added
            timestep = torch.zeros(video.shape[0], device=video.device, dtype=video.dtype)
        frames = self.vae.decode(video.to(self.vae_dtype), timestep, return_dict=False)[0]  # (B, 3, F, H, W)
        return frames.permute(0, 2, 1, 3, 4)  # (B, F, 3, H, W)

    def decode_audio(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents (B, N) -> float32 waveform (B, channels, samples) in [-1, 1] at
        `audio_sample_rate`: audio VAE -> mel spectrogram -> vocoder, as LTX2Pipeline."""
        if self.audio_vae is None or self.vocoder is None:
            raise RuntimeError("ltx2: no audio VAE / vocoder loaded; decode_audio needs both")
        with torch.no_grad():
            _, audio = self.unpacked_latents(latents.to(self.device, self.vae_dtype))
            mel = self.audio_vae.decode(audio.to(self.vae_dtype), return_dict=False)[0]
            wave = self.vocoder(mel.to(self.vae_dtype))
        return wave.float().clamp(-1.0, 1.0)

"""SANA (SanaTransformer2DModel) and SANA-Video (SanaVideoTransformer3DModel): linear-attention
DiTs with Gemma-2 text through cross-attention.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/sana/pipeline_sana.py
(image) and src/diffusers/pipelines/sana_video/pipeline_sana_video.py (video); "a / b" is image / video:
- timestep: SANA passes `t * config.timestep_scale` (914; 1.0 for SANA, other values belong
  to SANA-Sprint's own pipeline), SANA-Video passes t as is (947), with t = sigma * 1000
  from the flow-sigma scheduler. So the model input is sigma * 1000 (* timestep_scale).
- sign: the published schedulers are DPM-Solver / UniPC with `prediction_type="flow_prediction"`,
  whose model output is the flow velocity eps - x0 (the Euler step `x + (sigma_next - sigma) * v`
  of FlowMatchEulerDiscreteScheduler takes the same output). We only take their sigma grid
  (`sampling.sigmas=diffusers`, see sigmas.py); our steps stay Euler/SDE.
- learned sigma: a transformer with out_channels == 2 * in_channels predicts (v, var); the
  pipelines keep the first half (934 / 967). We do the same.
- guidance: true CFG (`uncond + g * (text - uncond)`, 930), the form of our `guided_velocity`
  (sampling.cfg_scale = guidance_scale). A transformer with `guidance_embeds` (SANA-Sprint) is
  refused: SanaPipeline does not feed it.
- text: Gemma-2 last hidden states with an attention mask, padded to max_sequence_length, then
  the first token plus the last max_sequence_length - 1 (`select_index`, 354 / 377: with the
  pipeline's complex human instruction prepended, the prompt's tokens are at the end). We call
  encode_prompt with the instruction the pipeline's `__call__` uses by default, read from its
  signature (701 / 741). The fixed length keeps a sample's condition independent of its
  batch-mates. Deviation: the pipeline encodes the CFG negative prompt without the
  instruction; our negative condition (sampling.cfg_scale > 1) is encoded like any prompt.
- decode: SANA `latents / scaling_factor` (961) through the DC-AE; SANA-Video (Wan2.1 VAE)
  `latents * latents_std + latents_mean` (1008), vae.decode gives (B, 3, F, H, W).
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.diffusers_adapters.wan import decode_wan_vae
from digenrl.models.protocol import Cond


_PIXEL_MULTIPLE = 32  # both pipelines' check_inputs (pipeline_sana.py:440-441, pipeline_sana_video.py:463-464)


class _GemmaText:
    """The text side both SANA pipelines share (encode_prompt with the pipeline's default
    complex human instruction)."""

    pipeline_class: str
    text_pipeline: Any
    device: torch.device
    max_sequence_length: int

    def _encode_text(self, prompts: list[str]) -> Cond:
        import diffusers

        call = getattr(diffusers, self.pipeline_class).__call__
        instruction = inspect.signature(call).parameters["complex_human_instruction"].default
        embeds, mask, _, _ = self.text_pipeline.encode_prompt(
            prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length, complex_human_instruction=instruction,
        )
        return {"prompt_embeds": embeds, "prompt_attention_mask": mask}  # (B, L, D), (B, L)


def _refuse_sprint(cls, pipe: Any) -> None:
    if getattr(pipe.transformer.config, "guidance_embeds", False):
        raise ValueError(f"{cls.family}: this transformer has guidance_embeds (SANA-Sprint), which "
                         f"{cls.pipeline_class} does not feed; SANA-Sprint is not supported")


def _first_half_if_learned_sigma(out: torch.Tensor, latent_channels: int) -> torch.Tensor:
    return out.chunk(2, dim=1)[0] if out.shape[1] == 2 * latent_channels else out


class SanaPolicy(_GemmaText, DiffusersPolicy):
    family = "sana"
    pipeline_class = "SanaPipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (1024, 1024)
    default_max_sequence_length = 300  # the pipeline's default
    # attn1 (linear self-attention) and attn2 (cross-attention): to_q/k/v, to_out.0 each
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        _refuse_sprint(cls, pipe)
        return super()._from_pipeline(pipe, text_modules, condition_modules, options)

    def _latent_shape(self) -> tuple[int, ...]:
        channels = self.module.config.in_channels
        factor = 2 ** (len(self.vae.config.encoder_block_out_channels) - 1) if self.vae is not None else 32
        m = max(_PIXEL_MULTIPLE, factor * self.module.config.patch_size)
        if self.height % m or self.width % m:
            raise ValueError(f"sana: height and width must be multiples of {m}, got {self.height}x{self.width}")
        return (channels, self.height // factor, self.width // factor)

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        out = self.module(
            x,  # (B, C, H, W)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_attention_mask=cond["prompt_attention_mask"],
            timestep=sigma * 1000.0 * self.module.config.timestep_scale,  # see module docstring
            return_dict=False,
        )[0]
        return _first_half_if_learned_sigma(out, x.shape[1])

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]  # (B, 3, H, W)


class SanaVideoPolicy(_GemmaText, DiffusersPolicy):
    family = "sana-video"
    pipeline_class = "SanaVideoPipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (480, 832)
    default_num_frames = 81  # the pipeline's default
    default_max_sequence_length = 300
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        _refuse_sprint(cls, pipe)
        if pipe.vae is not None and type(pipe.vae).__name__ != "AutoencoderKLWan":
            raise ValueError(f"sana-video: only the Wan2.1 VAE (AutoencoderKLWan) is supported, "
                             f"this pipeline has {type(pipe.vae).__name__}")
        return super()._from_pipeline(pipe, text_modules, condition_modules, options)

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            cfg = self.vae.config
            channels, t, s = cfg.z_dim, cfg.scale_factor_temporal, cfg.scale_factor_spatial
        else:
            channels, t, s = self.module.config.in_channels, 4, 8
        pt, ph, pw = self.module.config.patch_size
        if (self.num_frames - 1) % t or ((self.num_frames - 1) // t + 1) % pt:
            raise ValueError(f"sana-video: num_frames - 1 must be a multiple of {t}, got num_frames={self.num_frames}")
        m = max(_PIXEL_MULTIPLE, s * ph, s * pw)
        if self.height % m or self.width % m:
            raise ValueError(f"sana-video: height and width must be multiples of {m}, got {self.height}x{self.width}")
        return (channels, (self.num_frames - 1) // t + 1, self.height // s, self.width // s)

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        out = self.module(
            x,  # (B, C, F, H, W)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_attention_mask=cond["prompt_attention_mask"],
            timestep=sigma * 1000.0,  # SANA-Video's input is sigma * 1000 (see module docstring)
            return_dict=False,
        )[0]
        return _first_half_if_learned_sigma(out, x.shape[1])

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        return decode_wan_vae(self.vae, latents)

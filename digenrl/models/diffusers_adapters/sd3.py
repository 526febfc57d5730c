"""Stable Diffusion 3 / 3.5 (SD3Transformer2DModel): unpacked latents, CLIP-L + CLIP-G + T5 text.

Conventions, with line numbers in
diffusers@v0.42.1 src/diffusers/pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py:
- timestep: the pipeline passes the scheduler's t (1069-1076), t = sigma * 1000
  (FlowMatchEulerDiscreteScheduler: `timesteps = sigmas * num_train_timesteps`); the
  transformer embeds it as is. So the model input is sigma * 1000.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- text: encode_prompt concatenates the (padded) CLIP sequence (77) and T5 (max_sequence_length)
  along tokens, and the two pooled CLIP vectors (768 + 1280) along features.
- decode: latents / scaling_factor + shift_factor (1141).
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.protocol import Cond


class SD3Policy(DiffusersPolicy):
    family = "sd3"
    pipeline_class = "StableDiffusion3Pipeline"
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "text_encoder_3", "tokenizer_3")
    default_size = (512, 512)
    default_max_sequence_length = 256

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels = self.vae.config.latent_channels
            factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        else:
            channels, factor = self.module.config.in_channels, 8
        patch = self.module.config.patch_size
        if self.height % (factor * patch) or self.width % (factor * patch):
            raise ValueError(f"sd3: height and width must be multiples of {factor * patch}"
                             f", got {self.height}x{self.width}")
        return (channels, self.height // factor, self.width // factor)

    def _encode_text(self, prompts: list[str]) -> Cond:
        if getattr(self.text_pipeline, "text_encoder_3", None) is None:
            raise RuntimeError("sd3: text_encoder_3 (T5) is required to encode prompts here")
        prompt_embeds, _, pooled, _ = self.text_pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.device,
            do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled}  # (B, 77 + L, D), (B, Dp)

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        return self.module(
            hidden_states=x,  # (B, C, H, W)
            timestep=sigma * 1000.0,  # SD3's input is sigma * 1000 (see module docstring)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            pooled_projections=cond["pooled_prompt_embeds"].to(self.dtype),
            return_dict=False,
        )[0]

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        latents = latents / cfg.scaling_factor + cfg.shift_factor
        return self.vae.decode(latents, return_dict=False)[0]  # (B, 3, H, W) in [-1, 1]

"""Wan2.1 text-to-video (WanTransformer3DModel): (C, F, H, W) latents, UMT5 text.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/wan/pipeline_wan.py:
- timestep: `timestep = t.expand(...)` (613) with t = sigma * 1000 from the
  scheduler, passed as is (623). So the model input is sigma * 1000.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- text: UMT5 states, each cut to its own length and zero-padded to max_sequence_length
  (`_get_t5_prompt_embeds`); no mask goes to the transformer.
- decode: latents * latents_std + latents_mean per channel (the pipeline writes it as
  `latents / (1 / std) + mean`, 664-672); vae.decode gives (B, 3, F, H, W).
- only the single-transformer Wan2.1 layout: a Wan2.2 A14B folder (transformer_2) is
  refused with a pointer to model.name=wan2.2 (wan22.py); TI2V-5B (expand_timesteps) too.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.protocol import Cond


class WanPolicy(DiffusersPolicy):
    family = "wan"
    pipeline_class = "WanPipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (480, 832)
    default_num_frames = 33
    default_max_sequence_length = 512
    # Wan2.1 T2V attention is self (attn1) + cross (attn2), each to_q/k/v/out.0; the add_k_proj /
    # add_v_proj of the shared defaults exist only in the I2V model (added_kv_proj_dim), and
    # peft would skip those names silently
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        if getattr(pipe, "transformer_2", None) is not None:
            raise ValueError(f"{cls.family}: this Wan pipeline has two experts (transformer_2: Wan2.2 A14B); "
                             f"load it as model.name=wan2.2")
        if pipe.config.get("expand_timesteps", False):
            raise ValueError(f"{cls.family}: this Wan pipeline has expand_timesteps (Wan2.2 TI2V-5B), "
                             f"which is not supported")
        return super()._from_pipeline(pipe, text_modules, condition_modules, options)

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            cfg = self.vae.config
            channels, t, s = cfg.z_dim, cfg.scale_factor_temporal, cfg.scale_factor_spatial
        else:
            channels, t, s = self.module.config.out_channels, 4, 8  # I2V: in_channels adds the condition
        _, ph, pw = self.module.config.patch_size
        if (self.num_frames - 1) % t:
            raise ValueError(f"wan: num_frames - 1 must be a multiple of {t}, got num_frames={self.num_frames}")
        if self.height % (s * ph) or self.width % (s * pw):
            raise ValueError(f"wan: height and width must be multiples of {s * ph}, got {self.height}x{self.width}")
        return (channels, (self.num_frames - 1) // t + 1, self.height // s, self.width // s)

    def _encode_text(self, prompts: list[str]) -> Cond:
        prompt_embeds, _ = self.text_pipeline.encode_prompt(
            prompt=prompts, do_classifier_free_guidance=False, device=self.device,
            max_sequence_length=self.max_sequence_length,
        )
        return {"prompt_embeds": prompt_embeds}  # (B, L, D), zero past each prompt's length

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        return self.module(
            hidden_states=x,  # (B, C, F, H, W)
            timestep=sigma * 1000.0,  # Wan's input is sigma * 1000 (see module docstring)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            return_dict=False,
        )[0]

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        return decode_wan_vae(self.vae, latents)


def decode_wan_vae(vae, latents: torch.Tensor) -> torch.Tensor:
    """(B, C, F, H, W) latents of the Wan2.1 VAE (AutoencoderKLWan) -> (B, F, 3, H, W) frames:
    denormalised per channel (latents * std + mean, WanPipeline's decode), then decoded. Shared by
    the families on this VAE (SANA-Video, Cosmos-Predict2.5)."""
    cfg = vae.config
    shape = (1, cfg.z_dim, 1, 1, 1)
    mean = torch.tensor(cfg.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
    std = torch.tensor(cfg.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
    video = vae.decode(latents * std + mean, return_dict=False)[0]  # (B, 3, F, H, W)
    return video.permute(0, 2, 1, 3, 4)  # (B, F, 3, H, W)

"""FLUX.1 (FluxTransformer2DModel): 2x2-packed latent tokens, CLIP pooled + T5 sequence text.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/flux/pipeline_flux.py
("pipeline") and src/diffusers/models/transformers/transformer_flux.py ("transformer"):
- timestep: the pipeline passes `timestep=t / 1000` (pipeline 903) where t = sigma * 1000
  (FlowMatchEulerDiscreteScheduler: `timesteps = sigmas * num_train_timesteps`), and
  FluxTransformer2DModel.forward multiplies by 1000 itself (transformer 725).
  So the model input is sigma itself.
- guidance (FLUX.1-dev, `config.guidance_embeds`): the raw scale (pipeline 848), also
  x1000 inside the transformer (727). We carry it in the Cond as "guidance" (B,).
- sign: the scheduler steps `prev = x + (sigma_next - sigma) * model_output`, i.e. the
  output is v = eps - x0, our convention: no sign flip.
- decode: latents / scaling_factor + shift_factor, then vae.decode (pipeline 962-964).
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.diffusers_adapters.packing import flux_image_ids, pack_2x2, unpack_2x2
from digenrl.models.protocol import Cond


class FluxPolicy(DiffusersPolicy):
    family = "flux"
    pipeline_class = "FluxPipeline"
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    default_size = (1024, 1024)
    default_max_sequence_length = 512

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels = self.vae.config.latent_channels
            factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        else:
            channels, factor = self.module.config.in_channels // 4, 8
        h, w = self.height // factor, self.width // factor
        if h % 2 or w % 2 or h * factor != self.height or w * factor != self.width:
            raise ValueError(f"flux: height and width must be multiples of {2 * factor}"
                             f", got {self.height}x{self.width}")
        return (channels, h, w)

    def _encode_text(self, prompts: list[str]) -> Cond:
        prompt_embeds, pooled, _text_ids = self.text_pipeline.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled}  # (B, L, D), (B, Dp)

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        _, _, h, w = x.shape
        out = self._transformer(pack_2x2(x), flux_image_ids(h, w, self.device, self.dtype), sigma, cond)
        return unpack_2x2(out, h, w)

    def _transformer(self, tokens: torch.Tensor, img_ids: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        """Image tokens (B, N, 4C) with their RoPE ids (N, 3) + text -> velocity tokens (B, N, 4C)."""
        text = cond["prompt_embeds"]
        return self.module(
            hidden_states=tokens,
            timestep=sigma,  # FLUX's input is sigma (see module docstring)
            guidance=cond.get("guidance"),
            pooled_projections=cond["pooled_prompt_embeds"].to(self.dtype),
            encoder_hidden_states=text.to(self.dtype),
            txt_ids=torch.zeros(text.shape[1], 3, device=self.device, dtype=self.dtype),
            img_ids=img_ids,
            return_dict=False,
        )[0]

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        latents = latents / cfg.scaling_factor + cfg.shift_factor
        return self.vae.decode(latents, return_dict=False)[0]  # (B, 3, H, W) in [-1, 1]

"""Qwen-Image (QwenImageTransformer2DModel): 2x2-packed tokens, Qwen2.5-VL text with a mask.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/qwenimage/pipeline_qwenimage.py
(the transformer's: src/diffusers/models/transformers/transformer_qwenimage.py):
- timestep: the pipeline passes `timestep / 1000` (647) with t = sigma * 1000, and the
  transformer's time projection has scale=1000 (transformer_qwenimage.py:178).
  So the model input is sigma.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- packing: the same 2x2 packing as FLUX (`_pack_latents`), RoPE from `img_shapes`
  [(1, H/2, W/2)] per sample (595) instead of ids.
- text: the pipeline pads to the longest prompt of its batch; we pad to a fixed
  max_sequence_length with mask 0, so conditions concatenate and a sample's condition
  never depends on its batch-mates. The mask always goes to the transformer.
- CFG: the pipeline rescales the true-CFG velocity to the conditional norm (668-672); our
  `guided_velocity` is plain true CFG (no rescale).
- decode: the VAE is a video VAE with one frame: (B, C, 1, H, W), latents * std + mean
  (705-714), then frame 0.
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy, pad_tokens
from digenrl.models.diffusers_adapters.packing import pack_2x2, unpack_2x2
from digenrl.models.protocol import Cond


class QwenImagePolicy(DiffusersPolicy):
    family = "qwen-image"
    pipeline_class = "QwenImagePipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (1024, 1024)
    default_max_sequence_length = 256

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels, factor = self.vae.config.z_dim, 2 ** len(self.vae.temperal_downsample)
        else:
            channels, factor = self.module.config.in_channels // 4, 8
        h, w = self.height // factor, self.width // factor
        if h % 2 or w % 2 or h * factor != self.height or w * factor != self.width:
            raise ValueError(f"qwen-image: height and width must be multiples of {2 * factor}"
                             f", got {self.height}x{self.width}")
        return (channels, h, w)

    def _encode_text(self, prompts: list[str]) -> Cond:
        prompt_embeds, mask = self.text_pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(prompt_embeds.shape[:2], dtype=torch.long, device=prompt_embeds.device)
        n = self.max_sequence_length
        return {"prompt_embeds": pad_tokens(prompt_embeds, n), "prompt_embeds_mask": pad_tokens(mask, n)}

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        b, _, h, w = x.shape
        out = self.module(
            hidden_states=pack_2x2(x),  # (B, H/2 * W/2, 4C)
            timestep=sigma,  # Qwen-Image's input is sigma (see module docstring)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_hidden_states_mask=cond["prompt_embeds_mask"],
            img_shapes=[[(1, h // 2, w // 2)]] * b,
            return_dict=False,
        )[0]
        return unpack_2x2(out, h, w)

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
        std = torch.tensor(cfg.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
        frames = self.vae.decode(latents.unsqueeze(2) * std + mean, return_dict=False)[0]  # (B, 3, 1, H, W)
        return frames[:, :, 0]

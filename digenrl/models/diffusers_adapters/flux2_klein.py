"""FLUX.2 Klein (Flux2Transformer2DModel): 2x2-patchified, batch-normalised latents, Qwen3 text.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/flux2/pipeline_flux2_klein.py:
- latent space: the pipeline denoises the VAE latents *patchified* 2x2 into channels
  (`_patchify_latents`, 371: (B, C, H, W) -> (B, 4C, H/2, W/2)) and normalised by the VAE's
  batch-norm running statistics (`vae.bn`, 911-915 undo it: x * sqrt(var + eps) + mean,
  then `_unpatchify_latents`). That normalised (4C, H/2, W/2) tensor is our latent: the
  noise and the SDE live there. decode undoes both, then vae.decode.
- tokens: one per latent position, no further packing (`_pack_latents` 389: (B, 4C, h, w)
  -> (B, h*w, 4C)); image ids (t, h, w, l) = (0, row, col, 0) (`_prepare_latent_ids` 287-316),
  text ids (0, 0, 0, token) (`_prepare_text_ids` 267-283), both (B, S, 4) int64.
- timestep: the pipeline passes `timestep / 1000` (853) with t = sigma * 1000, and the
  transformer multiplies by 1000 (src/diffusers/models/transformers/transformer_flux2.py:1284).
  So the model input is sigma.
- guidance: `guidance=None` (854): Klein has no embedded guidance. It is true CFG,
  `neg + guidance_scale * (cond - neg)` (877) against the empty prompt, the same form as
  our `guided_velocity` (sampling.cfg_scale = guidance_scale). The step-distilled Klein
  checkpoints (`is_distilled`) skip CFG (596): run them with sampling.cfg_scale=1.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- text: Qwen3 hidden states of layers (9, 18, 27) stacked per token (`_get_qwen3_prompt_embeds`
  208-263), padded to max_sequence_length by the tokenizer (236); no mask reaches the
  transformer, so the length is fixed by construction.
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.protocol import Cond


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, 4C, H/2, W/2), channel order (c, dy, dx) as `_patchify_latents`."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)  # (B, C, 2, 2, H/2, W/2)
    return x.reshape(b, c * 4, h // 2, w // 2)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """(B, 4C, H/2, W/2) -> (B, C, H, W); the inverse of patchify."""
    b, c4, h, w = latents.shape
    x = latents.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)  # (B, C, H/2, 2, W/2, 2)
    return x.reshape(b, c4 // 4, h * 2, w * 2)


def position_ids(batch: int, h: int, w: int, text_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(img_ids (B, h*w, 4), txt_ids (B, L, 4)), int64, as the pipeline builds them."""
    zero = torch.arange(1)
    img = torch.cartesian_prod(zero, torch.arange(h), torch.arange(w), zero)  # (h*w, 4): (0, row, col, 0)
    txt = torch.cartesian_prod(zero, zero, zero, torch.arange(text_len))  # (L, 4): (0, 0, 0, token)
    return img.expand(batch, -1, -1).to(device), txt.expand(batch, -1, -1).to(device)


class Flux2KleinPolicy(DiffusersPolicy):
    family = "flux2-klein"
    pipeline_class = "Flux2KleinPipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (1024, 1024)
    default_max_sequence_length = 512
    # double-stream blocks: to_q/k/v, to_out.0 and the text stream's add_* / to_add_out; the
    # single-stream blocks fuse q, k, v and the MLP input in one Linear, to_qkv_mlp_proj
    # (their output Linear is `attn.to_out`, a name the double blocks use for a ModuleList)
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                            "to_add_out", "to_qkv_mlp_proj")

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels = 4 * self.vae.config.latent_channels
            factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        else:
            channels, factor = self.module.config.in_channels, 8
        if self.height % (2 * factor) or self.width % (2 * factor):
            raise ValueError(f"{self.family}: height and width must be multiples of {2 * factor}"
                             f", got {self.height}x{self.width}")
        return (channels, self.height // (2 * factor), self.width // (2 * factor))

    def _encode_text(self, prompts: list[str]) -> Cond:
        prompt_embeds, _text_ids = self.text_pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return {"prompt_embeds": prompt_embeds}  # (B, L, 3 * D): L = max_sequence_length (padded)

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        b, c, h, w = x.shape
        text = cond["prompt_embeds"]
        img_ids, txt_ids = position_ids(b, h, w, text.shape[1], self.device)
        out = self.module(
            hidden_states=x.flatten(2).transpose(1, 2),  # (B, h*w, 4C)
            encoder_hidden_states=text.to(self.dtype),
            timestep=sigma,  # FLUX.2's input is sigma (see module docstring)
            img_ids=img_ids,
            txt_ids=txt_ids,
            guidance=None,
            return_dict=False,
        )[0]
        return out.transpose(1, 2).reshape(b, c, h, w)

    def to_vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Our (B, 4C, H/2, W/2) normalised latents -> the VAE's (B, C, H, W), as the pipeline's
        output_type="latent" returns them (pipeline_flux2_klein.py:911-916)."""
        bn, eps = self.vae.bn, self.vae.config.batch_norm_eps
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + eps).to(latents.device, latents.dtype)
        return unpatchify(latents * std + mean)

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(self.to_vae_latents(latents), return_dict=False)[0]  # (B, 3, H, W)

"""Z-Image (ZImageTransformer2DModel): lists of latents and captions, reversed time, negated output.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/z_image/pipeline_z_image.py:
- timestep: the pipeline passes `(1000 - t) / 1000` (511) with t = sigma * 1000, and the
  transformer embeds `t * t_scale` (t_scale 1000,
  src/diffusers/models/transformers/transformer_z_image.py:955). So the model input is
  1 - sigma: its time runs from 0 (pure noise) to 1 (data).
- sign: the pipeline negates the output before the scheduler step (`noise_pred =
  -noise_pred`, 568): the model predicts x0 - eps. We return -output = eps - x0.
- inputs are lists, one tensor per sample: latents (C, 1, H, W) (the frame axis added at
  530) and each caption's own tokens (C_txt rows, 249: the tokenizer pads to
  max_sequence_length (231), then only the attention-masked rows are kept). Our Cond is
  batch-first: embeddings zero-padded to max_sequence_length plus their mask; _forward
  cuts each row back to its masked tokens, so the model sees the pipeline's lists.
- guidance: the pipeline's CFG is `pos + g * (pos - neg)` (551), i.e. ours
  (`neg + s * (pos - neg)`) with s = 1 + g: sampling.cfg_scale = 1 + guidance_scale (Z-Image
  Turbo: guidance_scale 0, cfg_scale 1). Its cfg_normalization / cfg_truncation options
  (514, 554) are not reproduced.
- text: Qwen3 hidden_states[-2] (244) over a chat template.
- decode: latents / scaling_factor + shift_factor, then vae.decode (593-595).
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy, pad_tokens
from digenrl.models.protocol import Cond


class ZImagePolicy(DiffusersPolicy):
    family = "z-image"
    pipeline_class = "ZImagePipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (1024, 1024)
    default_max_sequence_length = 512
    # attention.to_q/k/v and attention.to_out.0 in every layer (refiners included)
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels = self.vae.config.latent_channels
            factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        else:
            channels, factor = self.module.config.in_channels, 8
        patch = self.module.config.all_patch_size[0]  # the transformer's 2x2 patches
        if self.height % (patch * factor) or self.width % (patch * factor):
            raise ValueError(f"z-image: height and width must be multiples of {patch * factor}"
                             f", got {self.height}x{self.width}")
        return (channels, self.height // factor, self.width // factor)

    def _encode_text(self, prompts: list[str]) -> Cond:
        # encode_prompt rewrites its prompt list in place (chat template): hand it a copy
        embeds, _ = self.text_pipeline.encode_prompt(
            prompt=list(prompts), device=self.device, do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )  # a list of (L_i, D), each prompt's masked tokens
        n = self.max_sequence_length
        mask = torch.zeros(len(embeds), n, dtype=torch.long, device=self.device)
        for i, e in enumerate(embeds):
            mask[i, : e.shape[0]] = 1
        padded = torch.stack([pad_tokens(e.unsqueeze(0), n)[0] for e in embeds])  # (B, L, D)
        return {"prompt_embeds": padded, "prompt_embeds_mask": mask}

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        text, mask = cond["prompt_embeds"].to(self.dtype), cond["prompt_embeds_mask"].bool()
        captions = [text[i][mask[i]] for i in range(x.shape[0])]  # (L_i, D) each
        out = self.module(
            list(x.unsqueeze(2).unbind(0)),  # B tensors (C, 1, H, W)
            1.0 - sigma,  # Z-Image's time is 1 - sigma (see module docstring)
            captions,
            return_dict=False,
        )[0]
        return -torch.stack(out).squeeze(2)  # its output is x0 - eps; ours eps - x0: (B, C, H, W)

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        return self.vae.decode(latents / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0]

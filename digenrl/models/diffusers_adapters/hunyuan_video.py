"""HunyuanVideo (HunyuanVideoTransformer3DModel): (C, F, H, W) latents, Llama + CLIP text.

Conventions, with line numbers in
diffusers@v0.42.1 src/diffusers/pipelines/hunyuan_video/pipeline_hunyuan_video.py:
- timestep: `timestep = t.expand(...)` (676) with t = sigma * 1000, passed as is
  (681). So the model input is sigma * 1000.
- guidance (embedded, `config.guidance_embeds`, on for HunyuanVideo T2V): the pipeline
  passes guidance_scale * 1000 (659) and the transformer does not rescale it. The Cond
  carries the raw scale as "guidance" (B,); x1000 happens here.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- text: Llama hidden states (template prefix cropped) padded to max_sequence_length with
  an attention mask, plus the pooled CLIP vector.
- decode: latents / scaling_factor (726), vae.decode gives (B, 3, F, H, W).
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.protocol import Cond


class HunyuanVideoPolicy(DiffusersPolicy):
    family = "hunyuan-video"
    pipeline_class = "HunyuanVideoPipeline"
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    default_size = (480, 832)
    default_num_frames = 33
    default_max_sequence_length = 256

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels = self.vae.config.latent_channels
            t, s = self.vae.temporal_compression_ratio, self.vae.spatial_compression_ratio
        else:
            channels, t, s = self.module.config.in_channels, 4, 8
        p, pt = self.module.config.patch_size, self.module.config.patch_size_t
        if (self.num_frames - 1) % t or ((self.num_frames - 1) // t + 1) % pt:
            raise ValueError(f"hunyuan-video: num_frames - 1 must be a multiple of {t}"
                             f", got num_frames={self.num_frames}")
        if self.height % (s * p) or self.width % (s * p):
            raise ValueError(f"hunyuan-video: height and width must be multiples of {s * p}"
                             f", got {self.height}x{self.width}")
        return (channels, (self.num_frames - 1) // t + 1, self.height // s, self.width // s)

    def _encode_text(self, prompts: list[str]) -> Cond:
        prompt_embeds, pooled, mask = self.text_pipeline.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled, "prompt_attention_mask": mask}

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        guidance = cond.get("guidance")
        return self.module(
            hidden_states=x,  # (B, C, F, H, W)
            timestep=sigma * 1000.0,  # HunyuanVideo's input is sigma * 1000 (see module docstring)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_attention_mask=cond["prompt_attention_mask"],
            pooled_projections=cond["pooled_prompt_embeds"].to(self.dtype),
            guidance=None if guidance is None else (guidance * 1000.0).to(self.dtype),
            return_dict=False,
        )[0]

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        video = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]  # (B, 3, F, H, W)
        return video.permute(0, 2, 1, 3, 4)  # (B, F, 3, H, W)

"""HunyuanVideo 1.5 text-to-video (HunyuanVideo15Transformer3DModel): (C, F, H, W) latents with
an empty image condition concatenated on channels, Qwen2.5-VL + ByT5 text.

Conventions, with line numbers in
diffusers@v0.42.1 src/diffusers/pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5.py:
- input: the transformer takes [latents, condition latents, condition mask] on channels
  (737); for text-to-video both are zeros (`prepare_cond_latents_and_mask`), and the image
  embeddings are 729 zero tokens (719, `vision_num_semantic_tokens` 237), which the transformer
  recognises as "no image" and masks out. We build the same zeros.
- timestep: `t.expand(...)` (739) with t = sigma * 1000, passed as is. So the model input
  is sigma * 1000.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- guidance: the pipeline's `guider` (ClassifierFreeGuidance, its guidance_scale from the
  folder's guider config) is true CFG, our `guided_velocity` form: sampling.cfg_scale =
  guidance_scale. Its guidance_rescale (0 by default) is not reproduced.
- text: Qwen2.5-VL hidden states over the pipeline's template, cropped after the template
  (crop_start 108), padded to `tokenizer_max_length` (1000, our max_sequence_length) with a
  mask; plus ByT5 embeddings of the prompt's quoted glyph text (256 tokens, zeros and mask 0
  when there is none). Fixed lengths: a sample's condition never depends on its batch-mates.
- sigma grid: linspace(1, 0, N+1)[:-1] with the scheduler's static shift (703), as
  HunyuanVideo's.
- decode: latents / scaling_factor (825), vae.decode gives (B, 3, F, H, W); one sample at a
  time (see _decode).
Sequence parallelism: digenrl.models.sequence_parallel (its (B, 1, Q, K) attention mask).
The image-to-video pipeline (HunyuanVideo15ImageToVideoPipeline) is not built here.
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.protocol import Cond

IMAGE_TOKENS = 729  # the pipeline's vision_num_semantic_tokens: the (empty) image condition's length


class HunyuanVideo15Policy(DiffusersPolicy):
    family = "hunyuan-video-1.5"
    pipeline_class = "HunyuanVideo15Pipeline"
    text_components = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
    default_size = (480, 848)  # 16:9 at the 480p checkpoint's 640 target size, multiples of 16
    default_num_frames = 121  # the pipeline's default
    default_max_sequence_length = 1000  # the pipeline's tokenizer_max_length
    # double-stream blocks: video to_q/k/v/to_out.0 and the text stream's add_* / to_add_out
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                            "to_add_out")

    def _latent_shape(self) -> tuple[int, ...]:
        if self.vae is not None:
            channels = self.vae.config.latent_channels
            t, s = self.vae.config.temporal_compression_ratio, self.vae.config.spatial_compression_ratio
        else:
            channels, t, s = self.module.config.out_channels, 4, 16
        p, pt = self.module.config.patch_size, self.module.config.patch_size_t
        if (self.num_frames - 1) % t or ((self.num_frames - 1) // t + 1) % pt:
            raise ValueError(f"hunyuan-video-1.5: num_frames - 1 must be a multiple of {t}"
                             f", got num_frames={self.num_frames}")
        if self.height % (s * p) or self.width % (s * p):
            raise ValueError(f"hunyuan-video-1.5: height and width must be multiples of {s * p}"
                             f", got {self.height}x{self.width}")
        return (channels, (self.num_frames - 1) // t + 1, self.height // s, self.width // s)

    def _encode_text(self, prompts: list[str]) -> Cond:
        self.text_pipeline.tokenizer_max_length = self.max_sequence_length  # the pipeline's fixed length
        embeds, mask, embeds_2, mask_2 = self.text_pipeline.encode_prompt(
            prompt=prompts, device=self.device, batch_size=len(prompts))
        return {"prompt_embeds": embeds, "prompt_embeds_mask": mask,
                "prompt_embeds_2": embeds_2, "prompt_embeds_mask_2": mask_2}

    def _image_condition(self, x: torch.Tensor, cond: Cond) -> tuple[torch.Tensor, torch.Tensor]:
        """(condition latents + mask on channels (B, C + 1, F, H, W), image tokens (B, N, D)) of the
        model input: text-to-video's are zeros (the image-to-video family fills them)."""
        b, _, f, h, w = x.shape
        condition = torch.zeros(b, x.shape[1] + 1, f, h, w, dtype=x.dtype, device=x.device)  # latents + mask
        image = torch.zeros(b, IMAGE_TOKENS, self.module.config.image_embed_dim, dtype=x.dtype, device=x.device)
        return condition, image

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        condition, image = self._image_condition(x, cond)
        return self.module(
            hidden_states=torch.cat([x, condition], dim=1),  # (B, 2C + 1, F, H, W)
            image_embeds=image,
            timestep=sigma * 1000.0,  # HunyuanVideo 1.5's input is sigma * 1000 (see module docstring)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_attention_mask=cond["prompt_embeds_mask"],
            encoder_hidden_states_2=cond["prompt_embeds_2"].to(self.dtype),
            encoder_attention_mask_2=cond["prompt_embeds_mask_2"],
            return_dict=False,
        )[0]

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        # one sample at a time: the VAE's mid-block attention builds a (B, S, S) causal mask that
        # does not broadcast against its (B, 1, S, D) queries when B > 1 (diffusers@v0.42.1
        # src/diffusers/models/autoencoders/autoencoder_kl_hunyuanvideo15.py:146-154: "output with
        # shape [2, 1, 8, 8] doesn't match the broadcast shape [2, 2, 8, 8]")
        z = latents / self.vae.config.scaling_factor
        video = torch.cat([self.vae.decode(z[i : i + 1], return_dict=False)[0] for i in range(len(z))])
        return video.permute(0, 2, 1, 3, 4)  # (B, 3, F, H, W) -> (B, F, 3, H, W)

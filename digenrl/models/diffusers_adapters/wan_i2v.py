"""Wan2.1 image-to-video (WanTransformer3DModel with image_dim, WanImageToVideoPipeline).

The first frame conditions the video twice: its CLIP image states go to an extra
cross-attention (`encoder_hidden_states_image`), and its VAE latents, with a mask marking
the known frame, are concatenated to the noisy latents on channels. Conventions, with line
numbers in diffusers@v0.42.1 src/diffusers/pipelines/wan/pipeline_wan_i2v.py (timestep, text,
sign and decode as Wan2.1 T2V, see wan.py):
- image states: CLIP vision `hidden_states[-2]` of the image processor's input
  (`encode_image`, 241-251); our images are rounded to 8-bit first, as a PIL input is.
- first-frame latents: the frame followed by num_frames - 1 zero frames (432-434), VAE
  mode (`sample_mode="argmax"`), then `(latents - mean) * (1 / std)` (462).
- mask: 1 on every channel of latent frame 0, 0 elsewhere; `vae_scale_factor_temporal`
  channels (471-484: the first frame's mask repeated over the temporal factor, then folded).
- model input: `torch.cat([latents, condition], dim=1)` with condition = [mask, latents]
  (484, 772): (B, C + T + C, F, H, W).
- CFG: the unconditional branch sees the same image states and condition (785-795);
  protocol.guided_velocity gives it these entries.
- text: WanPipeline.encode_prompt (the I2V pipeline's is "Copied from" it, 253-254).
- only the Wan2.1 layout (no Wan2.2 `expand_timesteps`, no last frame).
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.wan import WanPolicy
from digenrl.models.protocol import Cond

# Wan2.1 I2V adds the image cross-attention's key/value projections (added_kv_proj_dim)
I2V_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_k_proj", "add_v_proj")


class WanI2VPolicy(WanPolicy):
    family = "wan-i2v"
    pipeline_class = "WanImageToVideoPipeline"
    # its encode_prompt is a copy of WanPipeline's, but its prompt cleaning calls ftfy without
    # checking that ftfy is installed (basic_clean in
    # diffusers@v0.42.1 src/diffusers/pipelines/wan/pipeline_wan_i2v.py:96-97); WanPipeline's checks
    text_pipeline_class = "WanPipeline"
    condition_components = ("image_encoder", "image_processor")
    default_lora_targets = I2V_LORA_TARGETS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # WanAttnProcessor splits the cross-attention context as image tokens + exactly 512
        # text tokens ("hardcoded for now",
        # diffusers@v0.42.1 src/diffusers/models/transformers/transformer_wan.py:88-91): any
        # other text length would feed text to the image projections
        if self.max_sequence_length != 512:
            raise ValueError(f"{self.family}: max_sequence_length must be 512 (the I2V transformer assumes "
                             f"512 text tokens), got {self.max_sequence_length}")

    def _temporal_factor(self) -> int:
        return self.vae.config.scale_factor_temporal if self.vae is not None else 4

    def encode_conditions(self, images: torch.Tensor) -> Cond:
        if set(self.condition_modules) != set(self.condition_components):
            raise RuntimeError(f"{self.family}: the first frame needs {', '.join(self.condition_components)} "
                               f"(loaded with the pipeline); have {sorted(self.condition_modules) or 'none'}")
        pixels = self._condition_pixels(images)  # (B, 3, H, W) in [-1, 1]
        b = pixels.shape[0]
        with torch.no_grad():
            # CLIP on 8-bit RGB, as the pipeline's PIL input reaches the image processor
            rgb = ((pixels.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
            rgb = list(rgb.permute(0, 2, 3, 1).cpu().numpy())  # B x (H, W, 3)
            encoder = self.condition_modules["image_encoder"]
            inputs = self.condition_modules["image_processor"](images=rgb, return_tensors="pt")
            inputs = inputs.to(self.device)
            inputs["pixel_values"] = inputs["pixel_values"].to(encoder.dtype)
            image_embeds = encoder(**inputs, output_hidden_states=True).hidden_states[-2]  # (B, N_img, D)

            # the first frame, then num_frames - 1 zero frames (mid-gray in [-1, 1]), as the pipeline builds it
            video = torch.cat([pixels[:, :, None], pixels.new_zeros(b, 3, self.num_frames - 1, *pixels.shape[-2:])],
                              dim=2)  # (B, 3, num_frames, H, W)
            latents = self.vae.encode(video).latent_dist.mode()  # (B, C, F, h, w)
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
        inv_std = 1.0 / torch.tensor(cfg.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
        return {"image_embeds": image_embeds.to(self.dtype),
                "first_frame_latents": ((latents - mean) * inv_std).to(self.dtype)}

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        b, _, f, h, w = x.shape
        mask = x.new_zeros(b, self._temporal_factor(), f, h, w)
        mask[:, :, 0] = 1.0  # latent frame 0 is the given frame
        condition = torch.cat([mask, cond["first_frame_latents"].to(self.dtype)], dim=1)  # (B, T + C, F, h, w)
        return self.module(
            hidden_states=torch.cat([x, condition], dim=1),  # (B, C + T + C, F, h, w)
            timestep=sigma * 1000.0,  # Wan's input is sigma * 1000 (wan.py)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_hidden_states_image=cond["image_embeds"].to(self.dtype),
            return_dict=False,
        )[0]

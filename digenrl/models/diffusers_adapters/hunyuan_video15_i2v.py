"""HunyuanVideo 1.5 image-to-video (HunyuanVideo15ImageToVideoPipeline): HunyuanVideo 1.5's
transformer with the first frame as its condition.

The first frame conditions the video twice, in the two inputs that text-to-video fills with
zeros (hunyuan_video15.py). Conventions, with line numbers in diffusers@v0.42.1
src/diffusers/pipelines/hunyuan_video1_5/pipeline_hunyuan_video1_5_image2video.py (timestep,
text, sign, grid and decode as text-to-video):
- image tokens: SigLIP `last_hidden_state` of the feature extractor's input (`_get_image_embeds`,
  391-402), our images rounded to 8-bit first, as a PIL input is.
- condition latents: the frame alone through the VAE (`_get_image_latents`, 375-389: one frame,
  `sample_mode="argmax"`, times `scaling_factor`), placed in latent frame 0, zeros elsewhere;
  the mask is 1 on latent frame 0 (`prepare_cond_latents_and_mask`, 594-632).
- model input: [latents, condition latents, mask] on channels (851): (B, 2C + 1, F, H, W).
- CFG: the unconditional branch sees the same image tokens and condition latents (889-909;
  only the text changes), which protocol.guided_velocity gives it.
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.hunyuan_video15 import HunyuanVideo15Policy
from digenrl.models.protocol import Cond


class HunyuanVideo15I2VPolicy(HunyuanVideo15Policy):
    family = "hunyuan-video-1.5-i2v"
    pipeline_class = "HunyuanVideo15ImageToVideoPipeline"
    # its encode_prompt and text templates are the text-to-video pipeline's ("Copied from"), whose
    # constructor needs no image encoder
    text_pipeline_class = "HunyuanVideo15Pipeline"
    condition_components = ("image_encoder", "feature_extractor")

    def encode_conditions(self, images: torch.Tensor) -> Cond:
        if set(self.condition_modules) != set(self.condition_components):
            raise RuntimeError(f"{self.family}: the first frame needs {', '.join(self.condition_components)} "
                               f"(loaded with the pipeline); have {sorted(self.condition_modules) or 'none'}")
        pixels = self._condition_pixels(images)  # (B, 3, H, W) in [-1, 1]
        with torch.no_grad():
            rgb = ((pixels.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
            rgb = list(rgb.permute(0, 2, 3, 1).cpu().numpy())  # B x (H, W, 3), as PIL images reach it
            encoder = self.condition_modules["image_encoder"]
            inputs = self.condition_modules["feature_extractor"].preprocess(
                images=rgb, do_resize=True, return_tensors="pt", do_convert_rgb=True).to(self.device)
            inputs["pixel_values"] = inputs["pixel_values"].to(encoder.dtype)
            image_embeds = encoder(**inputs).last_hidden_state  # (B, N_img, D)
            # one frame at a time: the VAE's mid-block attention mask does not broadcast for B > 1
            # (as in HunyuanVideo15Policy._decode)
            frame = torch.cat([self.vae.encode(pixels[i : i + 1, :, None]).latent_dist.mode()
                               for i in range(len(pixels))])  # (B, C, 1, h, w)
        return {"image_embeds": image_embeds.to(self.dtype),
                "first_frame_latents": (frame * self.vae.config.scaling_factor).to(self.dtype)}

    def _image_condition(self, x: torch.Tensor, cond: Cond) -> tuple[torch.Tensor, torch.Tensor]:
        b, c, f, h, w = x.shape
        condition = x.new_zeros(b, c + 1, f, h, w)  # [latents, mask] on channels
        condition[:, :c, :1] = cond["first_frame_latents"].to(x.dtype)  # latent frame 0 is the given frame
        condition[:, c, 0] = 1.0
        return condition, cond["image_embeds"].to(self.dtype)

"""Qwen-Image-Edit (QwenImageTransformer2DModel, QwenImageEditPipeline): Qwen-Image plus a reference.

The reference image enters twice: its VAE latents are packed and appended to the sample's
tokens (as FLUX.1 Kontext does), and the Qwen2.5-VL text encoder reads the instruction
together with the image, so a prompt's embedding depends on its image. Conventions, with line
numbers in diffusers@v0.42.1 src/diffusers/pipelines/qwenimage/pipeline_qwenimage_edit.py
(timestep, sign, packing and decode as Qwen-Image, see qwen_image.py):
- reference latents: `vae.encode(image[:, :, None])` mode (`sample_mode="argmax"`), then
  `(latents - mean) / std` per channel (`_encode_vae_image`, 406-425).
- tokens: `torch.cat([latents, image_latents], dim=1)` (767), output cut to the sample's
  tokens (782); RoPE from `img_shapes` [(1, H/2, W/2), (1, H_ref/2, W_ref/2)] (712-717).
- text: `encode_prompt(prompt, image)` (679-687); the pipeline passes its resized image
  (`prompt_image`, 663). The sequence includes the image's tokens, hence the longer default
  max_sequence_length (the pipeline's `tokenizer_max_length`, 1024).
- CFG: the negative prompt is encoded with the same image (688-697) and its branch sees the same
  reference tokens. Both depend on the row's image, so they ride in the row's Cond as
  `negative_prompt_embeds` / `negative_prompt_embeds_mask` (protocol.NEGATIVE_PREFIX) and
  `negative_cond` itself is empty. The pipeline also rescales the guided velocity to the
  conditional norm (799-801); our guided_velocity is plain true CFG (as qwen_image.py).
- reference size: the pipeline resizes the reference to ~1 MP at its aspect ratio
  (`calculate_dimensions`, 624); we use the output size (base._condition_pixels).
- prompt cache: keyed by prompt and an image digest (sha256 of the 8-bit reference).
- processor without torchvision: transformers 5.24 cannot build or load a Qwen2VLProcessor
  then, so `from_pretrained` passes the pipeline an image-only one (vl_processor.py).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from digenrl.models.diffusers_adapters.base import pad_tokens
from digenrl.models.diffusers_adapters.packing import pack_2x2, unpack_2x2
from digenrl.models.diffusers_adapters.qwen_image import QwenImagePolicy
from digenrl.models.diffusers_adapters.vl_processor import image_only_processor, torchvision_available
from digenrl.models.protocol import NEGATIVE_PREFIX, Cond, cond_cat, merge_conds

_TEXT_KEYS = ("prompt_embeds", "prompt_embeds_mask")


class QwenImageEditPolicy(QwenImagePolicy):
    family = "qwen-image-edit"
    pipeline_class = "QwenImageEditPipeline"
    text_components = ("text_encoder", "tokenizer", "processor")
    default_max_sequence_length = 1024

    @classmethod
    def _text_components_loaded(cls, path_or_id: str, local_files_only: bool) -> dict:
        if torchvision_available():
            return {}
        return {"processor": image_only_processor(path_or_id, "Qwen2VLProcessor", local_files_only=local_files_only)}

    # ---- inputs ------------------------------------------------------------------------

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        raise TypeError(f"{self.family} encodes each prompt together with its reference image: "
                        f"call digenrl.models.protocol.encode_inputs(policy, prompts, images)")

    def negative_cond(self, batch: int) -> Cond:
        """Empty: the negative prompt's embedding depends on each row's image, so it is in the
        row's Cond (negative_prompt_embeds, ...), where guided_velocity finds it."""
        return {}

    def encode_conditions(self, images: torch.Tensor) -> Cond:
        pixels = self._condition_pixels(images)  # (B, 3, H, W) in [-1, 1]
        with torch.no_grad():
            latents = self.vae.encode(pixels[:, :, None]).latent_dist.mode()  # (B, C, 1, h, w)
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
        std = torch.tensor(cfg.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
        return {"image_latents": ((latents - mean) / std)[:, :, 0].to(self.dtype)}  # (B, C, h, w)

    def encode_inputs(self, prompts: Sequence[str], images: torch.Tensor) -> Cond:
        rgb = self.reference_rgb(images)
        text = self._text_rows(list(prompts), rgb)
        negative = self._text_rows([self.options.negative_prompt] * len(rgb), rgb)
        text.update({NEGATIVE_PREFIX + k: v for k, v in negative.items()})
        return merge_conds(text, self.encode_conditions(images))

    def reference_rgb(self, images: torch.Tensor) -> list:
        """The references as the text encoder sees them: 8-bit (H, W, 3) arrays at the output size."""
        pixels = self._condition_pixels(images).float()
        rgb = ((pixels + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        return list(rgb.permute(0, 2, 3, 1).cpu().numpy())

    def text_key(self, prompt: str, rgb) -> str:
        """The prompt-cache key of (prompt, reference): the prompt and a digest of the 8-bit image."""
        digest = hashlib.sha256(rgb.tobytes() + str(rgb.shape).encode()).hexdigest()[:32]
        return f"{prompt}\0image:{digest}"

    def _text_rows(self, prompts: list[str], rgb: list) -> Cond:
        if self.cache is None:
            cond = self._encode_text_image(prompts, rgb)
        else:
            rows = []
            for p, im in zip(prompts, rgb):
                key = self.text_key(p, im)
                row = self.cache.get(key)
                if row is None:
                    row = {k: v[:1] for k, v in self._encode_text_image([p], [im]).items()}
                    self.cache.put(key, row)
                rows.append(row)
            cond = cond_cat(rows)
        return {k: v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device)
                for k, v in cond.items()}

    def _encode_text_image(self, prompts: list[str], rgb: list) -> Cond:
        if self.text_pipeline is None:
            where = f" in the prompt cache at {self.cache.root}" if self.cache is not None else ""
            raise RuntimeError(f"{self.family}: no text encoder loaded and (prompt, image) pairs not found{where}, "
                               f"e.g. {prompts[0]!r}")
        from PIL import Image

        with torch.no_grad():
            embeds, mask = self.text_pipeline.encode_prompt(
                prompt=prompts, image=[Image.fromarray(a) for a in rgb], device=self.device)
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        n = self.max_sequence_length
        return {"prompt_embeds": pad_tokens(embeds, n, uncut=self.family),
                "prompt_embeds_mask": pad_tokens(mask, n, uncut=self.family)}

    # ---- the velocity field --------------------------------------------------------------

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        b, _, h, w = x.shape
        ref = cond["image_latents"].to(self.dtype)  # (B, C, h_ref, w_ref)
        out = self.module(
            hidden_states=torch.cat([pack_2x2(x), pack_2x2(ref)], dim=1),  # (B, N + N_ref, 4C)
            timestep=sigma,  # Qwen-Image's input is sigma (qwen_image.py)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            encoder_hidden_states_mask=cond["prompt_embeds_mask"],
            img_shapes=[[(1, h // 2, w // 2), (1, ref.shape[2] // 2, ref.shape[3] // 2)]] * b,
            return_dict=False,
        )[0]
        return unpack_2x2(out[:, : (h // 2) * (w // 2)], h, w)  # the sample's tokens only

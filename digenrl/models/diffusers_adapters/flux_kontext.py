"""FLUX.1 Kontext (FluxTransformer2DModel, FluxKontextPipeline): FLUX.1 plus a reference image.

An edit model: the reference image's latents are packed like the sample's and appended to
its token sequence; the transformer attends over both, and only the sample's tokens are the
velocity. Conventions, with line numbers in
diffusers@v0.42.1 src/diffusers/pipelines/flux/pipeline_flux_kontext.py (timestep, guidance,
text, sign and decode as FLUX.1, see flux.py):
- reference latents: `vae.encode(image)` mode (`retrieve_latents(..., sample_mode="argmax")`),
  then `(latents - shift_factor) * scaling_factor` (`_encode_vae_image`, 599-611).
- tokens: `torch.cat([latents, image_latents], dim=1)` on the packed sequence (1037-1038);
  the output is cut back to the sample's tokens, `noise_pred[:, : latents.size(1)]` (1052).
- RoPE ids: the reference's ids are the sample's layout with the first coordinate 1 instead
  of 0 (`prepare_latents`, 659-663), appended after the sample's (961-962).
- CFG: the negative branch sees the same reference tokens (1054-1069);
  protocol.guided_velocity gives it the reference entry.
- reference size: the pipeline snaps the reference to a preferred Kontext resolution
  (`_auto_resize`, 938-946); we encode it at the output size (base._condition_pixels).
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.flux import FluxPolicy
from digenrl.models.diffusers_adapters.packing import flux_image_ids, pack_2x2, unpack_2x2
from digenrl.models.protocol import Cond


class FluxKontextPolicy(FluxPolicy):
    family = "flux-kontext"
    pipeline_class = "FluxKontextPipeline"

    def encode_conditions(self, images: torch.Tensor) -> Cond:
        pixels = self._condition_pixels(images)  # (B, 3, H, W) in [-1, 1]
        with torch.no_grad():
            latents = self.vae.encode(pixels).latent_dist.mode()  # (B, C, H/f, W/f)
        cfg = self.vae.config
        latents = (latents - cfg.shift_factor) * cfg.scaling_factor
        return {"image_latents": latents.to(self.dtype)}

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        _, _, h, w = x.shape
        ref = cond["image_latents"].to(self.dtype)  # (B, C, h_ref, w_ref)
        ref_ids = flux_image_ids(ref.shape[2], ref.shape[3], self.device, self.dtype)
        ref_ids[:, 0] = 1  # the reference's RoPE plane (pipeline: image_ids[..., 0] = 1)
        tokens = torch.cat([pack_2x2(x), pack_2x2(ref)], dim=1)  # (B, N + N_ref, 4C)
        ids = torch.cat([flux_image_ids(h, w, self.device, self.dtype), ref_ids])  # (N + N_ref, 3)
        out = self._transformer(tokens, ids, sigma, cond)
        return unpack_2x2(out[:, : (h // 2) * (w // 2)], h, w)  # the sample's tokens only

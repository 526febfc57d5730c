"""Qwen-Image 2.1 (QwenImage21Transformer2DModel): one block-causal stream of text then image
tokens, Qwen3-VL text, a 16x VAE with unpatched latents.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/qwenimage21/pipeline_qwenimage21.py
(those marked "transformer": src/diffusers/models/transformers/transformer_qwenimage21.py):
- latents: the VAE compresses 16x (`vae_scale_factor = 16`, 207) and the transformer takes one
  token per latent position (`_pack_latents` 416: a plain (B, C, h*w) -> (B, h*w, C) flatten).
  Our latent is the (C, H/16, W/16) tensor; height and width must be multiples of 32.
- timestep: the pipeline passes `timestep / 1000` (786) with t = sigma * 1000, and the time
  projection multiplies by 1000 (`QwenImage21TemporalTimesteps`). So the model input is sigma.
- sign: scheduler `prev = x + (sigma_next - sigma) * model_output`: output is eps - x0.
- joint sequence: `img_mask` marks, per text position, whether it is an image slot (none for
  text-to-image) and then one slot per 2x2 group of target latents (`append_target_slots`,
  752). The image block's RoPE frame position is the text length before it (transformer
  693-698), padding included: the pipeline pads a batch to its longest prompt (328), so in
  the pipeline a sample's velocity depends on its batch-mates. We keep each prompt's own
  tokens (Cond: padded to max_sequence_length with a mask) and run each group of rows with
  the same text length without padding: every sample gets what the pipeline gives it alone.
- CFG: true CFG `neg + g * (cond - neg)`, our `guided_velocity` form; the model is meant to
  be sampled without it (`true_cfg_scale` 1.0).
- text: the last hidden state of Qwen3-VL (before its final norm, 316) over the pipeline's
  template, system tokens dropped, each prompt's masked tokens only (`encode_prompt`).
  Deviation: a prompt longer than max_sequence_length tokens is cut there (the pipeline
  has no limit).
- processor without torchvision: transformers 5.24 cannot build or load a Qwen3VLProcessor
  then, so `from_pretrained` passes the pipeline an image-only one (vl_processor.py).
- decode: latents * latents_std + latents_mean on a one-frame (B, C, 1, H, W) (852-853), frame 0.
- sigma grid: the pipeline's `sample_sigmas` (model_index.json) when set, else
  linspace(1, 1/N, N), with the dynamic shift mu from the image tokens (733-745), see sigmas.py.
"""

from __future__ import annotations

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy, pad_tokens
from digenrl.models.diffusers_adapters.vl_processor import image_only_processor, torchvision_available
from digenrl.models.protocol import Cond

VAE_SCALE = 16  # the pipeline's vae_scale_factor (207), a constant there
SLOT = 4  # latent tokens per image slot of img_mask (2x2)


class NoProcessor:
    """Stands in for the Qwen3-VL processor when the text side is not loaded (prompts come from
    the prompt cache). QwenImage21Pipeline's constructor reads the processor (its system-prompt
    length and the image-pad token id, pipeline 229-232), so None cannot be passed there; this
    answers those two reads and refuses any encoding."""

    class _Tokenizer:
        def encode(self, text: str) -> list[int]:
            return [-1]  # no image-pad token: only image-conditioned prompts would look for it

    tokenizer = _Tokenizer()

    def apply_chat_template(self, *args, **kwargs) -> list[list[int]]:
        return [[]]  # no system tokens to drop: nothing is encoded here

    def __call__(self, *args, **kwargs):
        raise RuntimeError("qwen-image-2.1: no text processor loaded (text_encoders=False); "
                           "prompts must come from the prompt cache")


class QwenImage21Policy(DiffusersPolicy):
    family = "qwen-image-2.1"
    pipeline_class = "QwenImage21Pipeline"
    text_components = ("text_encoder", "processor")
    default_size = (1024, 1024)
    default_max_sequence_length = 512
    # every block's attention: to_q/k/v and to_out.0 (one stream; no add_* projections)
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    @classmethod
    def _text_components_skipped(cls) -> dict:
        return {"text_encoder": None, "processor": NoProcessor()}

    @classmethod
    def _text_components_loaded(cls, path_or_id: str, local_files_only: bool) -> dict:
        if torchvision_available():
            return {}
        return {"processor": image_only_processor(path_or_id, "Qwen3VLProcessor", local_files_only=local_files_only)}

    def _latent_shape(self) -> tuple[int, ...]:
        channels = self.vae.config.z_dim if self.vae is not None else self.module.config.in_channels
        if self.height % (2 * VAE_SCALE) or self.width % (2 * VAE_SCALE):
            raise ValueError(f"qwen-image-2.1: height and width must be multiples of {2 * VAE_SCALE}"
                             f", got {self.height}x{self.width}")
        return (channels, self.height // VAE_SCALE, self.width // VAE_SCALE)

    def _encode_text(self, prompts: list[str]) -> Cond:
        embeds, mask, _ = self.text_pipeline.encode_prompt(prompt=list(prompts), device=self.device)
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        n = self.max_sequence_length
        return {"prompt_embeds": pad_tokens(embeds, n, uncut=self.family),
                "prompt_embeds_mask": pad_tokens(mask.long(), n, uncut=self.family)}

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        b, c, h, w = x.shape
        lengths = cond["prompt_embeds_mask"].sum(dim=1)  # (B,) each prompt's own tokens
        out = torch.empty_like(x)
        for n in lengths.unique().tolist():  # rows sharing a text length run together, unpadded
            rows = (lengths == n).nonzero(as_tuple=True)[0]
            k = len(rows)
            img_mask = torch.cat([torch.zeros(k, n, dtype=torch.bool, device=x.device),
                                  torch.ones(k, h * w // SLOT, dtype=torch.bool, device=x.device)], dim=1)
            v = self.module(
                hidden_states=x[rows].flatten(2).transpose(1, 2),  # (k, h*w, C)
                encoder_hidden_states=cond["prompt_embeds"][rows, :n].to(self.dtype),
                timestep=sigma[rows],  # Qwen-Image 2.1's input is sigma (see module docstring)
                img_shapes=[[(1, h, w)]] * k,
                img_mask=img_mask,
                return_dict=False,
            )[0][:, -h * w:]
            out[rows] = v.transpose(1, 2).reshape(k, c, h, w)
        return out

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
        std = torch.tensor(cfg.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
        frames = self.vae.decode(latents.unsqueeze(2) * std + mean, return_dict=False)[0]  # (B, 3, 1, H, W)
        return frames[:, :, 0]

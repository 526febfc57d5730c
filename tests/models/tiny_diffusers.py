"""Tiny random-weight diffusers pipelines for CPU tests (no hub access needed).

Each `build_<family>(root)` makes a whole pipeline (transformer, VAE, text encoders,
handmade tokenizers, scheduler) with 1-2 layers and hidden sizes 16-32, saves it with
`save_pretrained(root)` and returns the folder: the same layout as a hub checkpoint.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

_LETTERS = list(string.ascii_lowercase)


def clip_tokenizer():
    from transformers import CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in _LETTERS:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def t5_tokenizer():
    from transformers import T5TokenizerFast

    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [("\u2581" + c, -1.0) for c in _LETTERS] + [(c, -2.0) for c in _LETTERS]
    return T5TokenizerFast(vocab=vocab, extra_ids=0)


def clip_text(hidden: int = 32, projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=2 + 2 * len(_LETTERS), hidden_size=hidden, intermediate_size=37, num_hidden_layers=1,
        num_attention_heads=4, max_position_embeddings=77, projection_dim=hidden,
        bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    torch.manual_seed(0)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg).eval()


def t5_text(d_model: int = 32, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = dict(vocab_size=3 + 2 * len(_LETTERS), d_model=d_model, d_ff=37, d_kv=8, num_layers=1, num_heads=4,
              relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(0)
    return (UMT5EncoderModel(UMT5Config(**kw)) if umt5 else T5EncoderModel(T5Config(**kw))).eval()


def image_vae(latent_channels: int = 4, shift: float = 0.1):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    # two blocks: spatial factor 2 (16x16 pixels -> 8x8 latents)
    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
        latent_channels=latent_channels, norm_num_groups=4, sample_size=16,
        scaling_factor=1.5, shift_factor=shift,
    )


def build_flux(root: Path, guidance_embeds: bool = True) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=guidance_embeds, axes_dims_rope=(2, 2, 4),
    )
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=image_vae(), transformer=transformer,
        text_encoder=clip_text(), tokenizer=clip_tokenizer(), text_encoder_2=t5_text(), tokenizer_2=t5_tokenizer(),
    )
    pipe.save_pretrained(root)
    return root


def build_sd3(root: Path) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=64, out_channels=4,
        pos_embed_max_size=16,
    )
    pipe = StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=image_vae(), transformer=transformer,
        text_encoder=clip_text(projection=True), tokenizer=clip_tokenizer(),
        text_encoder_2=clip_text(projection=True), tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5_text(), tokenizer_3=t5_tokenizer(),
    )
    pipe.save_pretrained(root)
    return root


def build_wan(root: Path, heads: int = 2) -> Path:
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.1, 0.0, 0.2], latents_std=[1.5, 2.0, 1.0, 0.5])
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=1, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )
    pipe = WanPipeline(tokenizer=t5_tokenizer(), text_encoder=t5_text(umt5=True), vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=transformer)
    pipe.save_pretrained(root)
    return root


def build_qwen_image(root: Path) -> Path:
    """Transformer + VAE only: tests here feed prompts through the prompt cache. The folder
    with a tiny Qwen2.5-VL text encoder and tokenizer is tiny_qwen_vl.build_qwen_image_text."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True],
                                 latents_mean=[0.1, 0.0, -0.1, 0.2], latents_std=[1.5, 1.0, 2.0, 0.5])
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                             tokenizer=None, transformer=transformer)
    pipe.save_pretrained(root)
    return root


def build_hunyuan_video(root: Path, heads: int = 2) -> Path:
    """Transformer + VAE only (prompts through the prompt cache, as for Qwen-Image)."""
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)

    torch.manual_seed(0)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=heads, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, act_fn="silu", norm_num_groups=4,
        scaling_factor=0.476986, spatial_compression_ratio=8, temporal_compression_ratio=4,
        mid_block_add_attention=True,
    )
    pipe = HunyuanVideoPipeline(text_encoder=None, tokenizer=None, transformer=transformer, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(), text_encoder_2=None, tokenizer_2=None)
    pipe.save_pretrained(root)
    return root


# Per family: builder, options for a tiny run, and for cache-fed families the Cond shapes
# (batch 1) a text encoder would produce.
FAMILY_SETUPS = {
    "flux": (build_flux, dict(height=16, width=16, max_sequence_length=8), None),
    "sd3": (build_sd3, dict(height=16, width=16, max_sequence_length=8), None),
    "wan": (build_wan, dict(height=16, width=16, num_frames=5, max_sequence_length=8), None),
    "qwen-image": (build_qwen_image, dict(height=16, width=16, max_sequence_length=8, text_encoders=False),
                   {"prompt_embeds": (1, 8, 16), "prompt_embeds_mask": (1, 8)}),
    "hunyuan-video": (build_hunyuan_video,
                      dict(height=16, width=16, num_frames=5, max_sequence_length=8, text_encoders=False),
                      {"prompt_embeds": (1, 8, 16), "pooled_prompt_embeds": (1, 8), "prompt_attention_mask": (1, 8)}),
}


def fake_text_cond(shapes: dict, prompt: str) -> dict:
    """A deterministic stand-in for a text encoder's output on one prompt (masks: first 5 valid)."""
    import zlib

    g = torch.Generator().manual_seed(zlib.crc32(prompt.encode()))
    cond = {}
    for name, shape in shapes.items():
        if "mask" in name:
            mask = torch.zeros(shape, dtype=torch.long)
            mask[:, :5] = 1
            cond[name] = mask
        else:
            cond[name] = torch.randn(shape, generator=g)
    return cond


# ---- conditioned families (edit, image-to-video): tests/models/test_conditioned_families.py ----


def build_flux_kontext(root: Path) -> Path:
    """FLUX.1 Kontext: the tiny FLUX.1 modules in a FluxKontextPipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        guidance_embeds=True, axes_dims_rope=(2, 2, 4),
    )
    pipe = FluxKontextPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=image_vae(), transformer=transformer,
        text_encoder=clip_text(), tokenizer=clip_tokenizer(), text_encoder_2=t5_text(), tokenizer_2=t5_tokenizer(),
    )
    pipe.save_pretrained(root)
    return root


def build_qwen_image_edit(root: Path) -> Path:
    """Transformer + VAE only: (prompt, image) embeddings come through the prompt cache
    (QwenImageEditPolicy.text_key). The folder with its text side (tiny Qwen2.5-VL encoder,
    tokenizer, Qwen2VLProcessor) is tiny_qwen_vl.build_qwen_image_edit_text."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageEditPipeline,
                           QwenImageTransformer2DModel)

    torch.manual_seed(0)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True],
                                 latents_mean=[0.1, 0.0, -0.1, 0.2], latents_std=[1.5, 1.0, 2.0, 0.5])
    pipe = QwenImageEditPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=None,
                                 tokenizer=None, processor=None, transformer=transformer)
    pipe.save_pretrained(root)
    return root


def clip_vision(hidden: int = 32, image_size: int = 16):
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    cfg = CLIPVisionConfig(hidden_size=hidden, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                           image_size=image_size, patch_size=4, projection_dim=hidden)
    torch.manual_seed(0)
    processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                   crop_size={"height": image_size, "width": image_size})
    return CLIPVisionModel(cfg).eval(), processor


def build_wan_i2v(root: Path) -> Path:
    """Wan2.1 I2V layout: in_channels = latents + mask (temporal factor 4) + first-frame latents,
    CLIP image states through the image cross-attention (image_dim, added_kv_proj_dim)."""
    from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline,
                           WanTransformer3DModel)

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.1, 0.0, 0.2], latents_std=[1.5, 2.0, 1.0, 0.5])
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4 + 4 + 4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=1, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, image_dim=32, added_kv_proj_dim=16,
    )
    image_encoder, image_processor = clip_vision()
    pipe = WanImageToVideoPipeline(tokenizer=t5_tokenizer(), text_encoder=t5_text(umt5=True), vae=vae,
                                   scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=transformer,
                                   image_encoder=image_encoder, image_processor=image_processor)
    pipe.save_pretrained(root)
    return root


# Per conditioned family: builder, options for a tiny run, and for cache-fed families the text
# Cond shapes (batch 1). Wan I2V's transformer assumes 512 text tokens (see wan_i2v.py).
CONDITIONED_SETUPS = {
    "flux-kontext": (build_flux_kontext, dict(height=16, width=16, max_sequence_length=8), None),
    "qwen-image-edit": (build_qwen_image_edit,
                        dict(height=16, width=16, max_sequence_length=8, text_encoders=False),
                        {"prompt_embeds": (1, 8, 16), "prompt_embeds_mask": (1, 8)}),
    "wan-i2v": (build_wan_i2v, dict(height=16, width=16, num_frames=5, max_sequence_length=512), None),
}


def tiny_images(n: int, seed: int, size: int = 16) -> torch.Tensor:
    """n RGB images (n, 3, size, size) in [0, 1] on the 8-bit grid (as if read from files): smooth
    color ramps plus noise, so a VAE sees structure and two seeds differ."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, size)
    base = torch.stack([ramp[None, :].expand(size, size), ramp[:, None].expand(size, size),
                        (ramp[None, :] * ramp[:, None])])  # (3, size, size)
    x = base[None] * torch.rand(n, 3, 1, 1, generator=g) + 0.3 * torch.rand(n, 3, size, size, generator=g)
    return (x.clamp(0, 1) * 255).round() / 255

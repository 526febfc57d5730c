"""Tiny random-weight pipelines of the newer families (Wan2.2 A14B, FLUX.2 Klein, Z-Image).

As tiny_diffusers.py: each `build_<family>(root)` saves a whole pipeline with 1-layer,
16-32-wide models and returns the folder. FLUX.2 Klein and Z-Image get a tiny Qwen3
text encoder (8 wide; 27 layers, since Klein reads hidden states 9, 18 and 27) behind a
one-character-per-token tokenizer with a chat template, so their text paths run too.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

from tests.models.tiny_diffusers import image_vae, t5_text, t5_tokenizer

WAN22_BOUNDARY = 0.875  # sigma: Flow-GRPO's 3-step grid (1, 0.9, 0.75, 0 at shift 3) crosses it


QWEN3_HIDDEN = 8


def qwen3_tokenizer():
    """Characters as tokens, pad 0; the chat template prefixes a role marker, as Qwen's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1}
    for c in string.ascii_lowercase + " :":
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
        chat_template="{% for m in messages %}u: {{ m['content'] }}{% endfor %}",
    )


def qwen3_text():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=32, hidden_size=QWEN3_HIDDEN, intermediate_size=16, num_hidden_layers=27,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=4, max_position_embeddings=64,
                      pad_token_id=0)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval()


def _wan_transformer(seed: int):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=1, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )


def build_wan22(root: Path, expand_timesteps: bool = False, two: bool = True) -> Path:
    """Wan2.2 A14B layout: two experts (different weights) and boundary_ratio. expand_timesteps
    (TI2V-5B) and two=False (a Wan2.1 layout) build the folders wan2.2 refuses."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.1, 0.0, 0.2], latents_std=[1.5, 2.0, 1.0, 0.5])
    pipe = WanPipeline(tokenizer=t5_tokenizer(), text_encoder=t5_text(umt5=True), vae=vae,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=_wan_transformer(0),
                       transformer_2=_wan_transformer(1) if two else None,
                       boundary_ratio=WAN22_BOUNDARY if two else None, expand_timesteps=expand_timesteps)
    pipe.save_pretrained(root)
    return root


def build_flux2_klein(root: Path) -> Path:
    """The VAE gets non-trivial batch-norm statistics; text: 3 Qwen3 layers x 8 wide = 24."""
    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline,
                           Flux2Transformer2DModel)

    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=3 * QWEN3_HIDDEN, timestep_guidance_channels=16,
        axes_dims_rope=(2, 2, 2, 2), guidance_embeds=False,
    )
    torch.manual_seed(0)
    # two blocks: spatial factor 2 (16x16 pixels -> 8x8 latents -> 4x4 after the 2x2 patchify)
    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16,
    )
    with torch.no_grad():  # the released VAE's statistics are far from (0, 1): make the test see them
        vae.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 16))
        vae.bn.running_var.copy_(torch.linspace(0.25, 4.0, 16))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    pipe = Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=qwen3_text(), tokenizer=qwen3_tokenizer(),
                              transformer=transformer)
    pipe.save_pretrained(root)
    return root


def z_image_transformer(n_layers: int = 1) -> torch.nn.Module:
    """A tiny ZImageTransformer2DModel: one noise and one context refiner block, n_layers main ones."""
    from diffusers import ZImageTransformer2DModel

    torch.manual_seed(0)
    return ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=n_layers, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, cap_feat_dim=QWEN3_HIDDEN, axes_dims=[4, 6, 6], axes_lens=[64, 32, 32],
    )


def build_z_image(root: Path) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    transformer = z_image_transformer()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    pipe = ZImagePipeline(scheduler=scheduler, vae=image_vae(), text_encoder=qwen3_text(),
                          tokenizer=qwen3_tokenizer(), transformer=transformer)
    pipe.save_pretrained(root)
    return root


# Per family, as tiny_diffusers.FAMILY_SETUPS: builder, options for a tiny run, and for
# cache-fed families the Cond shapes (batch 1) a text encoder would produce (none here).
NEW_SETUPS = {
    "wan2.2": (build_wan22, dict(height=16, width=16, num_frames=5, max_sequence_length=8), None),
    "flux2-klein": (build_flux2_klein, dict(height=16, width=16, max_sequence_length=8), None),
    # 10 tokens: "u: a red cat" (12 characters) is cut to fill them, "u: a dog" leaves 2 masked
    "z-image": (build_z_image, dict(height=16, width=16, max_sequence_length=10), None),
}

"""Published architecture configs, written inline, for random-weight builds (nothing is downloaded).

Used by `benchmarks/gpu_check.py` and `digenrl profile --arch sd3|flux --random`: the real
layer shapes with random weights, so timings and memory match the released models.

    policy, cond = build_random("flux", tiny=False, device=torch.device("cuda"), dtype=torch.bfloat16)
    v = policy.velocity(x, sigma, cond)          # x (1, *policy.latent_shape)

`tiny=True` swaps in 1-layer configs that run on a CPU in well under a second.
"""

from __future__ import annotations

from typing import Any

import torch

from digenrl.models.protocol import Cond

# stabilityai/stable-diffusion-3.5-medium transformer/config.json (2.24B parameters)
SD35_MEDIUM = dict(
    sample_size=128, patch_size=2, in_channels=16, num_layers=24, attention_head_dim=64, num_attention_heads=24,
    joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
# black-forest-labs/FLUX.1-dev transformer/config.json (11.9B parameters)
FLUX1_DEV = dict(
    patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
# black-forest-labs/FLUX.1-dev vae/config.json (84M-parameter decoder, 16 latent channels, /8).
# SD3.5's VAE has the same layers; only scaling_factor (1.5305) and shift_factor (0.0609) differ.
FLUX_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=16, block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2, norm_num_groups=32, sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
    use_quant_conv=False, use_post_quant_conv=False,
)
SD35_VAE = dict(FLUX_VAE, scaling_factor=1.5305, shift_factor=0.0609)

TINY = {
    "sd3": dict(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=64, out_channels=4,
                pos_embed_max_size=16),
    "flux": dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
                 num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                 axes_dims_rope=(2, 2, 4)),
}
# four blocks: the same /8 spatial factor as the real VAE, 4 latent channels (tiny sd3 in_channels;
# tiny flux packs 2x2 of them into its 16)
TINY_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8, 8, 8),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=1, norm_num_groups=4, sample_size=64, scaling_factor=1.0, shift_factor=0.0,
)
TINY_PIXELS, TINY_TEXT_TOKENS = 64, 16

# per arch: diffusers class, config, VAE config, pixels (square), text tokens in the joint
# sequence (sd3: 77 CLIP + 256 T5; flux: 512 T5), cost-model name (digenrl.sim.catalogue.MODELS)
ARCHS = {
    "sd3": ("SD3Transformer2DModel", SD35_MEDIUM, SD35_VAE, 512, 333, "sd3.5-medium"),
    "flux": ("FluxTransformer2DModel", FLUX1_DEV, FLUX_VAE, 1024, 512, "flux.1-12b"),
}


def random_transformer(arch: str, tiny: bool, device: torch.device) -> torch.nn.Module:
    """The arch's transformer with random weights, initialised directly on `device` (seconds on a GPU)."""
    import diffusers

    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} has no built-in config; allowed: {', '.join(ARCHS)}")
    cls_name, config = ARCHS[arch][0], (TINY[arch] if tiny else ARCHS[arch][1])
    torch.manual_seed(0)
    with torch.device(device):
        return getattr(diffusers, cls_name)(**config)


def random_vae(arch: str, tiny: bool, device: torch.device) -> torch.nn.Module:
    """The arch's VAE (AutoencoderKL) with random weights."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    with torch.device(device):
        return AutoencoderKL(**(TINY_VAE if tiny else ARCHS[arch][2]))


def build_random(arch: str, tiny: bool, device: torch.device, dtype: torch.dtype, *, vae: bool = False,
                 **options: Any) -> tuple[Any, Cond]:
    """(policy, cond): a random-weight policy at the arch's published resolution, and a random
    batch-1 condition with the real text length (what the text encoders would produce).

    options go to the adapter (train, gradient_checkpointing, ...); train defaults to "full".
    """
    from digenrl.models.diffusers_adapters import policy_class

    _, _, _, pixels, text_len, _ = ARCHS[arch]
    if tiny:
        pixels, text_len = TINY_PIXELS, TINY_TEXT_TOKENS
    options.setdefault("train", "full")
    options.setdefault("height", pixels)
    options.setdefault("width", pixels)
    transformer = random_transformer(arch, tiny, device)
    policy = policy_class(arch)(transformer, random_vae(arch, tiny, device) if vae else None, None,
                                device=str(device), dtype=dtype, **options)
    cfg = policy.module.config
    g = torch.Generator(device="cpu").manual_seed(1)
    cond = {
        "prompt_embeds": torch.randn(1, text_len, cfg.joint_attention_dim, generator=g).to(device, dtype),
        "pooled_prompt_embeds": torch.randn(1, cfg.pooled_projection_dim, generator=g).to(device, dtype),
    }
    return policy, policy._add_extras(cond)  # FLUX.1-dev: embedded guidance

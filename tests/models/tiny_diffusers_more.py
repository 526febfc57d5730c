"""Tiny random-weight pipelines of FLUX.2-dev, Qwen-Image 2.1, SANA, SANA-Video, HunyuanVideo 1.5 and
Cosmos-Predict2.5 (issue 28).

As tiny_diffusers.py: each `build_<family>(root)` saves a whole pipeline with 1-layer, 8-32-wide
models and returns the folder. FLUX.2-dev gets a tiny Mistral-3 (31 hidden states: it reads
layers 10, 20 and 30), SANA and SANA-Video a tiny Gemma-2, behind the one-character-per-token
tokenizer of tiny_diffusers_new.py, so their text paths run. Qwen-Image 2.1's prompts come
through the prompt cache here (its Qwen3-VL text side: tiny_qwen_vl.build_qwen_image21_text),
and so do HunyuanVideo 1.5's (Qwen2.5-VL + ByT5), as HunyuanVideo's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.models.tiny_diffusers_new import qwen3_tokenizer

TEXT_HIDDEN = 8


def mistral3_text():
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    cfg = Mistral3Config(
        vision_config=PixtralVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, head_dim=4, image_size=16, patch_size=4),
        text_config=MistralConfig(vocab_size=32, hidden_size=TEXT_HIDDEN, intermediate_size=16, num_hidden_layers=30,
                                  num_attention_heads=2, num_key_value_heads=2, head_dim=4,
                                  max_position_embeddings=64, pad_token_id=0),
        spatial_merge_size=1,
    )
    torch.manual_seed(0)
    return Mistral3ForConditionalGeneration(cfg).eval()


def mistral3_tokenizer():
    """The character tokenizer with a chat template over content lists, as Pixtral's processor
    takes them. It renders the user turn only: with a few-token max_sequence_length the
    pipeline's long system message would otherwise fill every prompt's tokens."""
    tok = qwen3_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'user' %}{% for c in m['content'] %}"
                         "u: {{ c['text'] }}{% endfor %}{% endif %}{% endfor %}")
    return tok


def gemma2_text():
    from transformers import Gemma2Config, Gemma2Model

    cfg = Gemma2Config(vocab_size=32, hidden_size=TEXT_HIDDEN, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=4, max_position_embeddings=4096,
                       pad_token_id=0)
    torch.manual_seed(0)
    return Gemma2Model(cfg).eval()


def build_flux2(root: Path) -> Path:
    """FLUX.2-dev layout: guidance_embeds on, Mistral-3 text (3 layers x 8 wide = 24); the VAE and
    its batch-norm statistics as the Klein build's."""
    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Pipeline,
                           Flux2Transformer2DModel)

    torch.manual_seed(0)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=3 * TEXT_HIDDEN, timestep_guidance_channels=16,
        axes_dims_rope=(2, 2, 2, 2), guidance_embeds=True,
    )
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4, sample_size=16,
    )
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 16))
        vae.bn.running_var.copy_(torch.linspace(0.25, 4.0, 16))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential")
    pipe = Flux2Pipeline(scheduler=scheduler, vae=vae, text_encoder=mistral3_text(), tokenizer=mistral3_tokenizer(),
                         transformer=transformer)
    pipe.save_pretrained(root)
    return root


QWEN21_TEXT = 16  # context_in_dim: the cached embeddings' width


def build_qwen_image21(root: Path) -> Path:
    """Transformer + VAE + scheduler, saved one by one with a model_index.json that has no text side
    (QwenImage21Pipeline cannot be built without a processor, see qwen_image21.NoProcessor). The
    VAE compresses 16x (5 levels) as the pipeline assumes: 32x32 pixels -> 2x2 latents."""
    import diffusers
    from diffusers import AutoencoderKLQwenImage21, FlowMatchEulerDiscreteScheduler, QwenImage21Transformer2DModel

    torch.manual_seed(0)
    transformer = QwenImage21Transformer2DModel(
        in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        context_in_dim=QWEN21_TEXT, axes_dims_rope=(2, 2, 4),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage21(base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1] * 5, num_res_blocks=1,
                                   temperal_downsample=[False] * 4, in_channels=3, out_channels=3,
                                   latents_mean=[0.1, 0.0, -0.1, 0.2], latents_std=[1.5, 1.0, 2.0, 0.5])
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                time_shift_type="exponential")
    for name, module in (("transformer", transformer), ("vae", vae), ("scheduler", scheduler)):
        module.save_pretrained(root / name)
    index = {"_class_name": "QwenImage21Pipeline", "_diffusers_version": diffusers.__version__,
             "transformer": ["diffusers", "QwenImage21Transformer2DModel"],
             "vae": ["diffusers", "AutoencoderKLQwenImage21"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": [None, None], "processor": [None, None], "sample_sigmas": None}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


def _sana_transformer(video: bool):
    from diffusers import SanaTransformer2DModel, SanaVideoTransformer3DModel

    kw = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
              num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
              caption_channels=TEXT_HIDDEN, sample_size=8)
    torch.manual_seed(0)
    if video:
        return SanaVideoTransformer3DModel(**kw, patch_size=(1, 2, 2), rope_max_seq_len=32)
    return SanaTransformer2DModel(**kw, patch_size=1)


def build_sana(root: Path) -> Path:
    """A 2-level DC-AE (32x32 pixels -> 16x16 latents); a FlowMatchEuler scheduler, so the pipeline's
    own loop is the Euler ODE ours is compared with (the released SANA uses DPM-Solver)."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline

    torch.manual_seed(0)
    vae = AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=4, encoder_block_out_channels=(8, 8),
                        decoder_block_out_channels=(8, 8), encoder_layers_per_block=(1, 1),
                        decoder_layers_per_block=(1, 1), encoder_qkv_multiscales=((), ()),
                        decoder_qkv_multiscales=((), ()), scaling_factor=0.5)
    pipe = SanaPipeline(tokenizer=qwen3_tokenizer(), text_encoder=gemma2_text(), vae=vae,
                        transformer=_sana_transformer(video=False),
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe.save_pretrained(root)
    return root


def build_sana_video(root: Path) -> Path:
    """The Wan2.1-VAE layout of SANA-Video 2B, with tiny_diffusers.build_wan's VAE."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, SanaVideoPipeline

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.1, 0.0, 0.2], latents_std=[1.5, 2.0, 1.0, 0.5])
    pipe = SanaVideoPipeline(tokenizer=qwen3_tokenizer(), text_encoder=gemma2_text(), vae=vae,
                             transformer=_sana_transformer(video=True),
                             scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe.save_pretrained(root)
    return root


def _hunyuan_video15_parts():
    """The tiny HunyuanVideo 1.5 transformer (1 block; image_embed_dim 8) and VAE (16x in space, 4x
    in time, 4 latent channels) both HunyuanVideo 1.5 builders save, each seeded."""
    from diffusers import AutoencoderKLHunyuanVideo15, HunyuanVideo15Transformer3DModel

    torch.manual_seed(0)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=2 * 4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
        num_refiner_layers=1, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=8, rope_axes_dim=(2, 2, 4),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8,) * 5, layers_per_block=1)
    return transformer, vae


def build_hunyuan_video15(root: Path) -> Path:
    """Transformer + VAE + guider (CFG off: guidance_scale 1); prompts through the prompt cache
    (the Qwen2.5-VL + ByT5 text side, as HunyuanVideo's). The VAE compresses 16x in space and 4x
    in time (5 blocks): 32x32 pixels, 5 frames -> (4, 2, 2, 2) latents."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline

    transformer, vae = _hunyuan_video15_parts()
    pipe = HunyuanVideo15Pipeline(text_encoder=None, tokenizer=None, transformer=transformer, vae=vae,
                                  scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=None,
                                  tokenizer_2=None, guider=ClassifierFreeGuidance(guidance_scale=1.0))
    pipe.save_pretrained(root)
    return root


# Per family, as tiny_diffusers.FAMILY_SETUPS: builder, options for a tiny run, and for cache-fed
# families the Cond shapes (batch 1) a text encoder would produce.
MORE_SETUPS = {
    "flux2": (build_flux2, dict(height=16, width=16, max_sequence_length=8), None),
    "qwen-image-2.1": (build_qwen_image21, dict(height=32, width=32, max_sequence_length=8, text_encoders=False),
                       {"prompt_embeds": (1, 8, QWEN21_TEXT), "prompt_embeds_mask": (1, 8)}),
    # the SANA pipelines take multiples of 32 pixels only (check_inputs)
    "sana": (build_sana, dict(height=32, width=32, max_sequence_length=8), None),
    "sana-video": (build_sana_video, dict(height=32, width=32, num_frames=5, max_sequence_length=8), None),
    "hunyuan-video-1.5": (build_hunyuan_video15,
                          dict(height=32, width=32, num_frames=5, max_sequence_length=8, text_encoders=False),
                          {"prompt_embeds": (1, 8, 16), "prompt_embeds_mask": (1, 8),
                           "prompt_embeds_2": (1, 8, 8), "prompt_embeds_mask_2": (1, 8)}),
}


def build_hunyuan_video15_i2v(root: Path) -> Path:
    """build_hunyuan_video15's transformer and VAE with the image-to-video pipeline's SigLIP image
    encoder (hidden size = the transformer's image_embed_dim, 8) and feature extractor."""
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler, HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    transformer, vae = _hunyuan_video15_parts()
    torch.manual_seed(0)
    encoder = SiglipVisionModel(SiglipVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, image_size=16, patch_size=4)).eval()
    extractor = SiglipImageProcessor(size={"height": 16, "width": 16})
    pipe = HunyuanVideo15ImageToVideoPipeline(
        text_encoder=None, tokenizer=None, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=None, tokenizer_2=None,
        guider=ClassifierFreeGuidance(guidance_scale=1.0), image_encoder=encoder, feature_extractor=extractor)
    pipe.save_pretrained(root)
    return root


# Conditioned families built here, as tiny_diffusers.CONDITIONED_SETUPS (HunyuanVideo 1.5 I2V:
# 32x32 pixels, 5 frames, its text through the prompt cache as text-to-video's)
MORE_CONDITIONED_SETUPS = {
    "hunyuan-video-1.5-i2v": (build_hunyuan_video15_i2v,
                              dict(height=32, width=32, num_frames=5, max_sequence_length=8, text_encoders=False),
                              {"prompt_embeds": (1, 8, 16), "prompt_embeds_mask": (1, 8),
                               "prompt_embeds_2": (1, 8, 8), "prompt_embeds_mask_2": (1, 8)}),
}


def gemma3_text():
    """A tiny Gemma-3 (its text tower read by LTX2Pipeline: every layer's hidden states, 2 layers + the
    embeddings = 3 x 8 wide) with a 1-layer SigLIP tower the class requires."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    cfg = Gemma3Config(
        text_config=Gemma3TextConfig(vocab_size=32, hidden_size=TEXT_HIDDEN, intermediate_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                     max_position_embeddings=64, pad_token_id=0, sliding_window=16),
        vision_config=SiglipVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=16, patch_size=4),
        mm_tokens_per_image=4,
    )
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(cfg).eval()


def build_ltx2(root: Path) -> Path:
    """LTX-2 (issue 28): a 2-block audio-video transformer, a video VAE compressing 2x in space and
    time (32x32 pixels, 5 frames -> (4, 3, 16, 16) latents), an audio VAE (8 mel bins -> 2 latent
    bins, 2 channels: 4-wide audio tokens; 5 frames at 24 fps -> 5 audio latents), a 2-channel
    vocoder at 16 kHz, the text connectors and a tiny Gemma-3 behind the character tokenizer. Both
    VAEs get non-trivial latent statistics so the two normalisations are exercised. The scheduler
    shifts dynamically, as the released LTX-2's."""
    from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler,
                           LTX2Pipeline, LTX2VideoTransformer3DModel)
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    text = gemma3_text()
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, caption_channels=TEXT_HIDDEN,
        rope_double_precision=False, rope_type="split")
    torch.manual_seed(0)
    connectors = LTX2TextConnectors(
        caption_channels=TEXT_HIDDEN, text_proj_in_factor=3, video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=4, video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=4, audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None, connector_rope_base_seq_len=32, rope_double_precision=False,
        rope_type="split")
    torch.manual_seed(0)
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    torch.manual_seed(0)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8)
    with torch.no_grad():
        vae.latents_mean.copy_(torch.tensor([0.1, -0.2, 0.0, 0.3]))
        vae.latents_std.copy_(torch.tensor([1.5, 0.5, 1.0, 2.0]))
        audio_vae.latents_mean.copy_(torch.tensor([0.2, 0.0, -0.1, 0.1]))
        audio_vae.latents_std.copy_(torch.tensor([0.5, 2.0, 1.0, 1.5]))
    torch.manual_seed(0)
    vocoder = LTX2Vocoder(in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                          upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                          leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    pipe = LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True), vae=vae,
                        audio_vae=audio_vae, text_encoder=text, tokenizer=qwen3_tokenizer(), connectors=connectors,
                        transformer=transformer, vocoder=vocoder)
    pipe.save_pretrained(root)
    return root


# LTX-2 (video + audio): text through its own Gemma-3 + connectors. Apart from MORE_SETUPS: its
# pipeline returns two latents, compared in test_ltx2.py
LTX2_SETUP = (build_ltx2, dict(height=32, width=32, num_frames=5, max_sequence_length=8), None)
AUDIO_SETUPS = {"ltx2": LTX2_SETUP}

# ---- Cosmos-Predict2.5 (tests/models/test_cosmos_predict25.py) -------------------------------------

COSMOS_TEXT_LAYERS = 2  # the tiny Qwen2.5-VL's layers: the transformer reads all of them, concatenated


def qwen25vl_text():
    """A tiny Qwen2.5-VL (2 layers, 8 wide): Cosmos-Predict2.5 runs only its language model on token
    ids (no image processor), so its text path runs here, unlike Qwen-Image's."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=32, hidden_size=TEXT_HIDDEN, intermediate_size=16,
                         num_hidden_layers=COSMOS_TEXT_LAYERS, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=1,
                         rope_scaling={"type": "mrope", "mrope_section": [1, 1, 0]}),
        vision_config=dict(depth=1, hidden_size=8, intermediate_size=16, num_heads=2, out_hidden_size=TEXT_HIDDEN,
                           patch_size=2, spatial_merge_size=1, temporal_patch_size=1, fullatt_block_indexes=[0]),
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(cfg).eval()


def install_cosmos_resize_stand_in() -> bool:
    """torchvision is not installed here, and the Cosmos transformer resizes its padding mask with
    `torchvision.transforms.functional.resize(..., NEAREST)` (transformer_cosmos.py 734-737). This sets
    a nearest-neighbour stand-in (torch's interpolate, mode "nearest") in that module when torchvision
    is absent; our adapter and the reference pipeline then run the same forward. Returns whether it
    was installed (False: the real torchvision is there)."""
    from types import SimpleNamespace

    from diffusers.models.transformers import transformer_cosmos

    if getattr(transformer_cosmos, "transforms", None) is not None:
        return False

    def resize(t, size, interpolation=None):
        return torch.nn.functional.interpolate(t, size=list(size), mode="nearest")

    transformer_cosmos.transforms = SimpleNamespace(
        functional=SimpleNamespace(resize=resize), InterpolationMode=SimpleNamespace(NEAREST="nearest"))
    return True


def cosmos_predict25_components() -> dict:
    """Transformer (the released layout: condition-mask channel, padding-mask channel, cross-attention
    projection from every text layer; 2 blocks, head dim 16: RoPE needs > 2 dims per axis) + Wan2.1 VAE (build_sana_video's) + UniPC with the
    released flow-Karras grid (sigma_max 200, sigma_min 0.01), as order 1 with no corrector: then each
    UniPC step is exactly an Euler step (x0 = x - sigma v; x' = sigma'/sigma x + (1 - sigma'/sigma) x0
    = x + (sigma' - sigma) v), so the pipeline's own loop is the Euler ODE ours is compared with, on
    the released grid."""
    from diffusers import AutoencoderKLWan, CosmosTransformer3DModel, UniPCMultistepScheduler

    torch.manual_seed(0)
    transformer = CosmosTransformer3DModel(
        in_channels=4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=2, mlp_ratio=2.0,
        text_embed_dim=16, adaln_lora_dim=4, max_size=(8, 8, 8), patch_size=(1, 2, 2), rope_scale=(1.0, 3.0, 3.0),
        concat_padding_mask=True, extra_pos_embed_type=None, use_crossattn_projection=True,
        crossattn_proj_in_channels=COSMOS_TEXT_LAYERS * TEXT_HIDDEN, encoder_hidden_states_channels=16,
    )
    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.1, -0.1, 0.0, 0.2], latents_std=[1.5, 2.0, 1.0, 0.5])
    scheduler = UniPCMultistepScheduler(use_karras_sigmas=True, use_flow_sigmas=True, prediction_type="flow_prediction",
                                        sigma_max=200.0, sigma_min=0.01, solver_order=1, disable_corrector=[0, 1, 2, 3])
    return dict(transformer=transformer, vae=vae, scheduler=scheduler, text_encoder=qwen25vl_text(),
                tokenizer=mistral3_tokenizer())


def build_cosmos_predict25(root: Path) -> Path:
    """The components saved one by one (Cosmos2_5_PredictBasePipeline cannot be built without a safety
    checker) with a model_index.json naming the guardrail's class, as a pipeline saved with it would:
    our loader never imports it. The tokenizer's chat template renders the user turn only (a few-token
    max_sequence_length would otherwise hold only the pipeline's system message)."""
    import diffusers

    parts = cosmos_predict25_components()
    for name, module in parts.items():
        module.save_pretrained(root / name)
    libraries = {"transformer": "diffusers", "vae": "diffusers", "scheduler": "diffusers",
                 "text_encoder": "transformers", "tokenizer": "transformers"}
    index = {"_class_name": "Cosmos2_5_PredictBasePipeline", "_diffusers_version": diffusers.__version__,
             **{name: [libraries[name], type(m).__name__] for name, m in parts.items()},
             "safety_checker": ["cosmos_guardrail", "CosmosSafetyChecker"]}
    (root / "model_index.json").write_text(json.dumps(index))
    return root


# 32x32 pixels, 5 frames -> (4, 2, 4, 4) latents; the text through the tiny Qwen2.5-VL
COSMOS_SETUPS = {
    "cosmos-predict2.5": (build_cosmos_predict25, dict(height=32, width=32, num_frames=5, max_sequence_length=8),
                          None),
}

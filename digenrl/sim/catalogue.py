"""What the simulator knows about the hardware and models it prices, before any measurement.

Facts from papers, model cards and datasheets only: architecture (ModelSpec, MODELS),
text encoders, VAEs, reward models, network links, bytes per parameter, and the formulas
that follow from them alone (tokens_for, forward_flops, lora_params_B). Nothing here
reads the calibration file or returns seconds: calibration.py fits the measurements,
collectives.py prices bytes on links, memory.py and costs.py combine the three. It is
its own module so that a testbed (testbed.py) can be validated against these tables
without building a cost model.

Units: GIB (2**30 B) for memory, MS (1e-3 s) for the calibration file's times; link
bandwidth in GB/s (1e9 B/s), parameters in billions (params_B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from digenrl.models.families import FAMILIES
from digenrl.config.runtime import WEIGHT_SYNC_METHODS  # noqa: F401 (priced by CostModel.weight_sync_s)

GIB = 2.0**30
MS = 1e-3

# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class Shape:
    """Output size of one sample: pixels, and frames for video (1 for images)."""

    height: int
    width: int
    frames: int = 1
    text_tokens: int | None = None  # text tokens in the joint sequence (None: the model's default)

    @property
    def pixels(self) -> int:
        return self.height * self.width * self.frames


@dataclass(frozen=True)
class AudioStream:
    """A second token stream beside the video's, in the same blocks (LTX-2's audio): its
    latent frames follow the video's duration, frames / fps seconds at `latents_per_s`
    (one token each, patch 1). tok_params_B: linear parameters an audio token passes
    through; `hidden` the audio attention's inner width, used by its self-attention and by
    both audio-video cross-attentions."""

    latents_per_s: float
    fps: float
    hidden: int
    tok_params_B: float
    token_values: int

    def tokens(self, frames: int) -> int:
        return round(frames / self.fps * self.latents_per_s)


@dataclass(frozen=True)
class ModelSpec:
    """What the cost model needs to know about a generator's architecture.

    hidden/layers: width and number of attention layers over the whole sequence (the T^2
    part). tok_params_B: linear-layer parameters each token passes through (FLOPs per
    token = 2x); dual-stream MMDiT blocks hold text and image weights but each token uses
    one stream, so this is ~12 d^2 per layer, not params/layers. lora_mats: number of
    adapted d x d attention projections over all layers (q, k, v, out per stream).
    """

    name: str
    params_B: float
    kind: str  # "image" | "video"
    hidden: int
    layers: int
    tok_params_B: float
    text_tokens: int  # text tokens inside the joint sequence (0: text via cross-attention)
    calib_shape: Shape
    vae: str
    text_encoder: str
    lora_mats: int
    scaled_from: str | None = None  # no measurement: costs scaled from this model
    # The sequence (tokens_for): one token per `spatial` x `spatial` pixels (VAE factor x patch),
    # per `temporal` frames for video (causal VAE: the first frame alone); `image_copies` 2 when
    # a reference image's latents join the sample's (edit models).
    spatial: int = 16
    temporal: int = 4
    image_copies: int = 1
    token_values: int = 64  # latent values per image token (VAE channels x patch area): 16 x 2 x 2
    linear_attn_dim: int = 0  # > 0: linear (kernel) attention with this head dim, no T^2 term (SANA)
    fsdp: bool = True  # the runtime shards it in a trainer gang (False: two experts, schema refuses fsdp)
    active_params_B: float | None = None  # parameters one forward reads (two experts: one of them)
    audio: AudioStream | None = None  # a joint audio stream (LTX-2), priced by sample_flops

    @property
    def active_B(self) -> float:
        return self.params_B if self.active_params_B is None else self.active_params_B


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # MMDiT-X, 24 joint layers of width 1536 (+ self-attention in the first 13); text = 77 CLIP + 256 T5.
        ModelSpec("sd3.5-medium", 2.243, "image", 1536, 24, 0.80, 333, Shape(512, 512), "sd3-vae",
                  "t5xxl+clip-l+clip-g", 24 * 8),
        # 19 double-stream + 38 single-stream blocks, width 3072: 57 * 12 * 3072^2 = 6.45B per token.
        ModelSpec("flux.1-12b", 11.901, "image", 3072, 57, 6.45, 512, Shape(1024, 1024), "flux-vae",
                  "t5xxl+clip-l", 19 * 8 + 38 * 4),
        # 30 layers, width 1536, FFN 8960: (4 self + 2 cross q/o + 11.7 FFN) d^2 per layer. Text by cross-attention.
        ModelSpec("wan2.1-1.3b", 1.419, "video", 1536, 30, 1.25, 0, Shape(480, 832, 33), "wan-vae",
                  "umt5-xxl", 30 * 8),
        # 40 layers, width 5120, FFN 13824: (4 + 2 + 5.4) d^2 * 40 = 11.95B per token.
        ModelSpec("wan2.1-14b", 14.288, "video", 5120, 40, 11.95, 0, Shape(480, 832, 33), "wan-vae",
                  "umt5-xxl", 40 * 8),
        # 60 dual-stream layers, width 3072: 60 * 12 * 3072^2 = 6.79B per token (params 20.4B: two streams).
        ModelSpec("qwen-image-20b", 20.430, "image", 3072, 60, 6.79, 256, Shape(1024, 1024), "qwen-image-vae",
                  "qwen2.5-vl-7b", 60 * 8),
        # HunyuanVideo: 20 double + 40 single blocks, width 3072, 256 LLaVA text tokens in the sequence.
        # NOT measured: every cost scaled from wan2.1-14b by FLOPs (see calibration.scale_model), flagged estimated.
        ModelSpec("hunyuanvideo-13b", 12.821, "video", 3072, 60, 6.79, 256, Shape(480, 832, 33), "hunyuan-vae",
                  "llava-llama3-8b+clip-l", 20 * 8 + 40 * 4, scaled_from="wan2.1-14b"),
        # ---- NOT measured: every entry below is scaled (calibration.scale_model) and flagged estimated.
        # Parameters: the diffusers 0.42.1 transformer class built on the meta device from the
        # config.json values quoted (tests/sim/test_catalogue_families.py counts them again).
        # tok_params_B: d^2 per layer a token passes through, as for the entries above.
        #
        # Wan2.2 A14B (Wan-AI/Wan2.2-T2V-A14B-Diffusers): two Wan2.1-14B-shaped experts (dim 5120, 40
        # layers, ffn 13824), one per step by noise level: both resident, one read per forward.
        # LoRA on both (the default model.experts=both). FSDP refused by the schema (two experts).
        ModelSpec("wan2.2-a14b", 2 * 14.288, "video", 5120, 40, 11.95, 0, Shape(480, 832, 33), "wan-vae",
                  "umt5-xxl", 2 * 40 * 8, scaled_from="wan2.1-14b", fsdp=False, active_params_B=14.288),
        # Wan2.1-I2V-14B-480P: the 14B plus image cross-attention (image_dim 1280, added_kv_proj_dim
        # 5120: +2 d^2 per layer on the 257 CLIP tokens, not per video token), in_channels 36.
        ModelSpec("wan2.1-i2v-14b", 16.395, "video", 5120, 40, 11.95, 0, Shape(480, 832, 33), "wan-vae",
                  "umt5-xxl+clip-h", 40 * 8 + 40 * 2, scaled_from="wan2.1-14b"),
        # FLUX.1-Kontext-dev: FLUX.1-dev's transformer; the reference's packed latents join the sequence.
        ModelSpec("flux.1-kontext-12b", 11.901, "image", 3072, 57, 6.45, 512, Shape(1024, 1024), "flux-vae",
                  "t5xxl+clip-l", 19 * 8 + 38 * 4, scaled_from="flux.1-12b", image_copies=2),
        # Qwen-Image-Edit: Qwen-Image's transformer + the reference's latents; its text sequence holds
        # the Qwen2.5-VL tokens of the reference (1036^2 / 28^2 = 37^2 = 1369 at 1 MP) + the prompt's:
        # 1400 is an ESTIMATE (prompt length assumed ~30 after the template's 64 are dropped).
        ModelSpec("qwen-image-edit-20b", 20.430, "image", 3072, 60, 6.79, 1400, Shape(1024, 1024),
                  "qwen-image-vae", "qwen2.5-vl-7b+image", 60 * 8, scaled_from="qwen-image-20b", image_copies=2),
        # FLUX.2 [klein] 4B (black-forest-labs/FLUX.2-klein-4B transformer/config.json: num_layers 5,
        # num_single_layers 20, 24 heads x 128, joint_attention_dim 7680, mlp_ratio 3, in_channels 128):
        # 13 d^2 per block (qkv 3 + out 1 + SwiGLU 6 + 3), 25 * 13 * 3072^2 = 3.07B per token.
        # Latents: 32-channel /8 VAE, 2x2-patchified into 128 channels, one token per 16x16 pixels.
        ModelSpec("flux.2-klein-4b", 3.876, "image", 3072, 25, 3.07, 512, Shape(1024, 1024), "flux2-vae",
                  "qwen3-4b-x3", 5 * 8 + 20 * 5, scaled_from="flux.1-12b", token_values=128),
        # FLUX.2 [klein] 9B (num_layers 8, num_single_layers 24, 32 heads x 128, joint dim 12288):
        # 32 * 13 * 4096^2 = 6.98B per token.
        ModelSpec("flux.2-klein-9b", 9.079, "image", 4096, 32, 6.98, 512, Shape(1024, 1024), "flux2-vae",
                  "qwen3-8b-x3", 8 * 8 + 24 * 5, scaled_from="flux.1-12b", token_values=128),
        # FLUX.2-dev (num_layers 8, num_single_layers 48, 48 heads x 128, joint dim 15360):
        # 56 * 13 * 6144^2 = 27.48B per token.
        ModelSpec("flux.2-dev-32b", 32.223, "image", 6144, 56, 27.48, 512, Shape(1024, 1024), "flux2-vae",
                  "mistral-small-3.1-24b-x3", 8 * 8 + 48 * 5, scaled_from="flux.1-12b", token_values=128),
        # Z-Image (ZImageTransformer2DModel's defaults, Z-Image-Turbo's config: dim 3840, 30 layers +
        # 2 noise refiners, 30 heads; the recipe's base Z-Image is assumed to share them):
        # single stream, 12 d^2 per layer (attention 4 + SwiGLU 8) over 32 layers = 5.66B per token.
        # Text: each caption's own tokens (the adapter cuts the padding): 128 is an ESTIMATE.
        ModelSpec("z-image-6b", 6.155, "image", 3840, 32, 5.66, 128, Shape(1024, 1024), "flux-vae",
                  "qwen3-4b", 34 * 4, scaled_from="flux.1-12b"),
        # Qwen-Image-2.1 (QwenImage21Transformer2DModel: 32 single-stream layers, 32 heads x 128,
        # mlp_ratio 3, context_in_dim 4096): 32 * 13 * 4096^2 = 6.98B per token; /16 VAE with 64
        # channels, patch 1. Text: Qwen3-VL-8B states of the masked prompt, 256 an ESTIMATE.
        ModelSpec("qwen-image-2.1-7b", 7.115, "image", 4096, 32, 6.98, 256, Shape(1024, 1024),
                  "qwen-image-2.1-vae", "qwen3-vl-8b", 32 * 4, scaled_from="qwen-image-20b"),
        # SANA 1.6B (Efficient-Large-Model/Sana_1600M_1024px_diffusers: 20 layers, 70 heads x 32 =
        # 2240, mlp_ratio 2.5, caption 2304): linear self-attention, text by cross-attention;
        # (4 self + 2 cross q/o + 7.5 Mix-FFN) d^2 * 20 = 1.355B per token; DC-AE /32, patch 1.
        ModelSpec("sana-1.6b", 1.604, "image", 2240, 20, 1.355, 0, Shape(1024, 1024), "dc-ae-f32c32",
                  "gemma-2-2b", 20 * 8, scaled_from="sd3.5-medium", spatial=32, token_values=32,
                  linear_attn_dim=32),
        # SANA-Video 2B (Efficient-Large-Model/SANA-Video_2B_480p_diffusers: 20 layers, 20 heads x
        # 112, Wan2.1 VAE, patch 1x2x2): linear attention; blocks 1.860B less the text k/v (2 d^2 per
        # layer) = 1.66B per token.
        ModelSpec("sana-video-2b", 1.906, "video", 2240, 20, 1.66, 0, Shape(480, 832, 81), "wan-vae",
                  "gemma-2-2b", 20 * 8, scaled_from="wan2.1-1.3b", linear_attn_dim=112),
        # HunyuanVideo-1.5 (hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v: 54 dual-stream layers,
        # 16 heads x 128 = 2048, mlp_ratio 4): 54 * 12 * 2048^2 = 2.72B per token; VAE 16x in space,
        # 4x in time, 32 channels, patch 1. Joint text: 1000 Qwen2.5-VL + 256 byT5 tokens (padded).
        ModelSpec("hunyuanvideo-1.5-8b", 8.327, "video", 2048, 54, 2.72, 1256, Shape(480, 848, 121),
                  "hunyuan15-vae", "qwen2.5-vl-7b+byt5", 54 * 8, scaled_from="wan2.1-14b", token_values=32),
        # HunyuanVideo-1.5 I2V (HunyuanVideo15ImageToVideoPipeline): the same transformer (its
        # text-to-video input already carries the zero condition channels); the first frame adds
        # SigLIP's 729 image tokens to the joint text stream (vision_num_semantic_tokens).
        ModelSpec("hunyuanvideo-1.5-i2v-8b", 8.327, "video", 2048, 54, 2.72, 1256 + 729, Shape(480, 848, 121),
                  "hunyuan15-vae", "qwen2.5-vl-7b+byt5+siglip", 54 * 8, scaled_from="wan2.1-14b", token_values=32),
        # LTX-2 (Lightricks/LTX-2: 48 layers, video 32 heads x 128 = 4096, audio 32 x 64; VAE 32x in
        # space, 8x in time, 128 channels, patch 1): per video token (4 self + 2 cross + 8 FFN +
        # 1 audio-to-video q/o at the audio width + 1 video-to-audio k/v) d^2 * 48 = 12.88B. The
        # audio stream (diffusers transformer_ltx2.py LTX2VideoTransformerBlock; pipeline_ltx2.py
        # 1306-1310: 16 kHz / hop 160 / 4 = 25 latent frames per second of video, 126 for 121
        # frames at the pipeline's 24 fps; 8 channels x 16 mel bins = 128 values each): per audio
        # token (4 self + 2 cross + 8 FFN + 2 video-to-audio q/o + 2 audio-to-video k/v) at
        # d_a = 2048, x 48 = 3.62B; priced by sample_flops, ~0.8% of a forward at 512x768x121.
        # Cosmos-Predict2.5 (nvidia/Cosmos-Predict2.5-2B and -14B, revision diffusers/base/post-trained;
        # architecture from diffusers' scripts/convert_cosmos_to_diffusers.py TRANSFORMER_CONFIGS: 28 / 36
        # blocks, 16 / 40 heads x 128, mlp_ratio 4, patch 1x2x2, Wan2.1 VAE): per video token (4 self +
        # 2 cross q/o + 8 FFN) d^2 x layers = 1.644B / 13.21B; text by cross-attention from the 100352-wide
        # stack of Cosmos-Reason1-7B's 28 layers, projected to 1024 (not counted per token).
        ModelSpec("cosmos-predict2.5-2b", 2.059, "video", 2048, 28, 1.644, 0, Shape(704, 1280, 93), "wan-vae",
                  "cosmos-reason1-7b", 28 * 8, scaled_from="wan2.1-1.3b"),
        ModelSpec("cosmos-predict2.5-14b", 14.368, "video", 5120, 36, 13.21, 0, Shape(704, 1280, 93), "wan-vae",
                  "cosmos-reason1-7b", 36 * 8, scaled_from="wan2.1-14b"),
        ModelSpec("ltx-2-19b", 18.876, "video", 4096, 48, 12.88, 0, Shape(512, 768, 121), "ltx2-vae",
                  "gemma-3-12b", 48 * 8, scaled_from="wan2.1-14b", spatial=32, temporal=8, token_values=128,
                  audio=AudioStream(25.0, 24.0, 2048, 18 * 2048**2 * 48 / 1e9, 128)),
    ]
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; allowed: {sorted(MODELS)}") from None


def image_patches(model: str | ModelSpec, shape: Shape | None = None) -> int:
    """Latent tokens of one sample's own output (no text, no reference image): (H/s)(W/s), x the
    latent frames ((F-1)/t + 1) for video, with s = ModelSpec.spatial and t = ModelSpec.temporal."""
    m = get_model(model) if isinstance(model, str) else model
    s = shape or m.calib_shape
    if s.height % m.spatial or s.width % m.spatial:
        raise ValueError(f"height and width must be multiples of {m.spatial} for {m.name}, got {s.height}x{s.width}")
    patches = (s.height // m.spatial) * (s.width // m.spatial)
    if m.kind == "video":
        if (s.frames - 1) % m.temporal:
            raise ValueError(f"frames must be {m.temporal}k+1 for {m.name} (causal video VAE), got {s.frames}")
        patches *= (s.frames - 1) // m.temporal + 1
    return patches


def tokens_for(model: str | ModelSpec, shape: Shape | None = None) -> int:
    """Sequence length of one sample: latent patches (+ a reference image's, + text tokens in
    joint attention).

    Most families: VAE /8, patch 2 -> (H/16)(W/16); video (Wan, HunyuanVideo): causal VAE 4x in
    time, patch 1x2x2 -> ((F-1)/4 + 1)(H/16)(W/16). SANA (DC-AE /32, patch 1) and LTX-2 (/32,
    8x in time) set ModelSpec.spatial / temporal. Edit models (FLUX.1 Kontext, Qwen-Image-Edit)
    append the reference's latents at the output size (image_copies 2). Text tokens:
    shape.text_tokens when a recipe sets its own prompt length, else the model's default.
    """
    m = get_model(model) if isinstance(model, str) else model
    s = shape or m.calib_shape
    return image_patches(m, s) * m.image_copies + (m.text_tokens if s.text_tokens is None else s.text_tokens)


def audio_tokens(model: str | ModelSpec, shape: Shape | None = None) -> int:
    """Tokens of one sample's audio stream (0: no audio)."""
    m = get_model(model) if isinstance(model, str) else model
    return m.audio.tokens((shape or m.calib_shape).frames) if m.audio else 0


def latent_values(model: str | ModelSpec, shape: Shape | None = None) -> int:
    """Values of one sample's latent (what a trajectory stores per step): its patches x
    token_values, plus its audio tokens x their values."""
    m = get_model(model) if isinstance(model, str) else model
    audio = audio_tokens(m, shape) * m.audio.token_values if m.audio else 0
    return image_patches(m, shape) * m.token_values + audio


def forward_flops(model: str | ModelSpec, tokens: int) -> float:
    """FLOPs of one forward for one sample: 2 * linear params * T + 4 * d * L * T^2 (QK^T, AV);
    linear attention (SANA): 4 * d * L * T * head_dim (K^T V, then Q (K^T V))."""
    m = get_model(model) if isinstance(model, str) else model
    attn = tokens * m.linear_attn_dim if m.linear_attn_dim else tokens**2
    return 2e9 * m.tok_params_B * tokens + 4.0 * m.hidden * m.layers * attn


def sample_flops(model: str | ModelSpec, shape: Shape | None = None) -> float:
    """FLOPs of one forward for one sample at `shape` (default: the calibration shape):
    forward_flops of its sequence (tokens_for), plus an audio stream's linear layers and
    attention (its self-attention, and both cross-attentions with the video's patches, at the
    audio width)."""
    m = get_model(model) if isinstance(model, str) else model
    flops = forward_flops(m, tokens_for(m, shape))
    if m.audio:
        ta, tv = audio_tokens(m, shape), image_patches(m, shape)
        flops += 2e9 * m.audio.tok_params_B * ta + 4.0 * m.audio.hidden * m.layers * (ta * ta + 2 * ta * tv)
    return flops


# Text encoders: (params_B, text tokens per prompt). Only T5-XXL at 512 tokens is measured;
# the others scale that per-sample cost by params * tokens (estimated).
TEXT_ENCODERS = {
    "t5xxl": (4.762, 512),
    "t5xxl+clip-l": (4.885, 512),
    "t5xxl+clip-l+clip-g": (5.580, 333),
    "umt5-xxl": (5.680, 512),
    "qwen2.5-vl-7b": (8.290, 256),  # whole VLM resident; text-only prompts use the 7.6B LM
    "llava-llama3-8b+clip-l": (8.400, 256),
    # not measured: scaled like the others (params from the model cards; tokens: the pipelines'
    # max_sequence_length, diffusers 0.42.1)
    "qwen2.5-vl-7b+image": (8.290, 1400),  # Qwen-Image-Edit: the reference's VL tokens + the prompt (estimate)
    "umt5-xxl+clip-h": (6.312, 512),  # Wan I2V: + the CLIP ViT-H/14 image tower (0.632B)
    "qwen3-4b": (4.022, 512),  # Z-Image
    "qwen3-4b-x3": (4.022, 512),  # FLUX.2 klein 4B: three layers' states stacked
    "qwen3-8b-x3": (8.191, 512),  # FLUX.2 klein 9B
    "mistral-small-3.1-24b-x3": (24.011, 512),  # FLUX.2-dev
    "qwen3-vl-8b": (8.770, 256),  # Qwen-Image-2.1 (the prompt's length: estimate)
    "gemma-2-2b": (2.614, 300),  # SANA, SANA-Video
    "qwen2.5-vl-7b+byt5": (7.290, 1256),  # HunyuanVideo-1.5: the 7.07B LM + byT5-small's encoder
    "qwen2.5-vl-7b+byt5+siglip": (7.718, 1256),
    "cosmos-reason1-7b": (8.290, 512),  # Cosmos-Predict2.5: a Qwen2.5-VL-7B, every layer's states, 512 tokens  # HunyuanVideo-1.5 I2V: + SigLIP so400m's vision tower (0.428B)
    "gemma-3-12b": (12.190, 1024),  # LTX-2
}

# Width of the text-encoder states a pipeline passes to the transformer (prompt_embeds[-1]).
TEXT_DIMS = {"t5xxl": 4096, "t5xxl+clip-l": 4096, "t5xxl+clip-l+clip-g": 4096, "umt5-xxl": 4096,
             "qwen2.5-vl-7b": 3584, "llava-llama3-8b+clip-l": 4096, "qwen2.5-vl-7b+image": 3584,
             "umt5-xxl+clip-h": 4096, "qwen3-4b": 2560, "qwen3-4b-x3": 3 * 2560, "qwen3-8b-x3": 3 * 4096,
             "mistral-small-3.1-24b-x3": 3 * 5120, "qwen3-vl-8b": 4096, "gemma-2-2b": 2304,
             "qwen2.5-vl-7b+byt5": 3584, "qwen2.5-vl-7b+byt5+siglip": 3584, "gemma-3-12b": 3840,
             "cosmos-reason1-7b": 28 * 3584}

# VAEs: decoder params_B, the calibration entry whose per-pixel cost it uses, and a factor.
VAES = {
    "flux-vae": (0.084, "flux-vae", 1.0),
    "sd3-vae": (0.084, "flux-vae", 1.0),  # same 16-channel design as FLUX's
    "qwen-image-vae": (0.127, "flux-vae", 1.0),  # Wan-derived image VAE; per-pixel cost taken from flux-vae
    "wan-vae": (0.127, "wan-vae", 1.0),
    # Wan2.1 report: Wan-VAE decodes ~2.5x faster than HunyuanVideo's VAE on the same GPU.
    "hunyuan-vae": (0.246, "wan-vae", 2.5),
    # not measured, and no published speed ratio: the calibration VAE's per-pixel cost as it is
    # (params: encoder + decoder, the diffusers 0.42.1 classes' default configs on the meta device)
    "flux2-vae": (0.084, "flux-vae", 1.0),  # AutoencoderKLFlux2, 32 channels
    "dc-ae-f32c32": (0.363, "flux-vae", 1.0),  # SANA's AutoencoderDC
    "qwen-image-2.1-vae": (0.338, "flux-vae", 1.0),  # AutoencoderKLQwenImage21
    "hunyuan15-vae": (1.261, "wan-vae", 1.0),  # AutoencoderKLHunyuanVideo15
    "ltx2-vae": (1.276, "wan-vae", 1.0),  # AutoencoderKLLTX2Video 1.223 + AutoencoderKLLTX2Audio 0.053 (vocoder not counted)
}
# The shape each calibration VAE was measured at: decode time and memory scale by pixels / these pixels.
VAE_CALIB_SHAPES = {"flux-vae": Shape(1024, 1024), "wan-vae": Shape(480, 832, 33)}

# Reward models: params_B, FLOPs per sample, fixed seconds (launches + preprocessing).
# No measurement: seconds = FLOPs / (H200 peak * 0.4 MFU) + fixed, always estimated.
#   PickScore / HPSv2: CLIP ViT-H/14, image tower 0.63B at 257 tokens + text tower 0.35B at 77.
#   VideoAlign (DanceGRPO's video reward): Qwen2-VL-2B over ~1200 visual + 100 text tokens.
REWARD_MODELS = {
    "pickscore": (0.99, 2 * (0.63e9 * 257 + 0.35e9 * 77), 10 * MS),
    "hpsv2": (0.99, 2 * (0.63e9 * 257 + 0.35e9 * 77), 10 * MS),
    "videoalign": (2.21, 2 * 2.21e9 * 1300, 20 * MS),
    # PaddleOCR on the host CPU (yifan123/flow_grpo@ac4c86e flow_grpo/ocr.py:9,17 use_gpu=False;
    # leibniz-csi/mm_grpo@301f5c05 gerl/utils/reward_score/ocr.py:41 device="cpu"): no GPU work
    # beyond the VAE decode.
    "ocr-cpu": (0.0, 0.0, 0.0),
    # Qwen3-VL-8B as an OCR judge (veRL-Omni's genrm_ocr): a generative judge (JUDGES below),
    # whose FLOPs here are its prefill at 512x512; costs.reward_model_s prices it from JUDGES.
    "qwen3-vl-8b": (8.77, 2 * (8.19e9 * (256 + 40) + 0.58e9 * 1024), 10 * MS),
}
REWARD_MFU = 0.4


@dataclass(frozen=True)
class Judge:
    """A generative (VLM) judge: it reads the image and writes an answer, token by token.

    Its reward time is prefill + decode (costs.judge_prefill_s, costs.judge_decode_s): the
    prefill is FLOPs (2 x LM params x (image + prompt tokens), + the ViT over its patches); the
    decode is tokens x per-token latency, each token reading every LM weight once (lm_params_B x
    bytes_per_weight over the GPUs' memory bandwidth at the server's tensor-parallel degree),
    plus, in eager mode, a host launch cost per layer (EAGER_LAYER_S). A batch of answers
    decodes together and ends with its longest (longest_answer). The answer length the recipe
    asks for (max_tokens), eager mode and the tensor-parallel degree are the testbed's
    (judge_max_tokens, judge_eager, judge_tp), as the recipe sets them.
    """

    name: str
    lm_params_B: float  # the language model the decode reads per token
    vit_params_B: float  # the vision tower (prefill only)
    layers: int  # LM decoder layers (eager launch cost, TP all-reduces: 2 per layer)
    hidden: int
    bytes_per_weight: int  # 2: bf16 weights as served
    patch: int  # ViT patch, pixels
    merge: int  # patches merged per LM token along each side
    prompt_tokens: int  # chat template + instruction
    answer_tokens: int  # mean answer length (ESTIMATE where the note says so)
    note: str = ""

    def image_tokens(self, shape: Shape) -> int:
        """LM tokens of one image (per frame pair for video: temporal patch 2)."""
        side = self.patch * self.merge
        frames = 1 if shape.frames == 1 else -(-shape.frames // 2)
        return -(-shape.height // side) * -(-shape.width // side) * frames

    def prefill_flops(self, shape: Shape) -> float:
        """FLOPs of one request's prefill: the LM over image + prompt tokens, the ViT over its patches."""
        img = self.image_tokens(shape)
        return 2e9 * (self.lm_params_B * (img + self.prompt_tokens) + self.vit_params_B * img * self.merge**2)

    @property
    def decode_bytes(self) -> float:
        """Weight bytes one decode step reads (the whole LM, split over a tensor-parallel group)."""
        return self.lm_params_B * 1e9 * self.bytes_per_weight


JUDGES = {
    # Qwen3-VL-8B-Instruct (config.json: text 36 layers, hidden 4096; vision patch 16, spatial
    # merge 2): 8.19B LM + 0.58B ViT. 512x512 -> 16 x 16 = 256 LM tokens. Prompt: genrm_ocr's
    # one-line instruction in the chat template, ~40 tokens. ESTIMATE: a mean answer of 30
    # tokens (the OCR targets are short phrases; no published length distribution).
    "qwen3-vl-8b": Judge("qwen3-vl-8b", 8.19, 0.58, 36, 4096, 2, 16, 2, 40, 30,
                         "answer_tokens 30 an ESTIMATE"),
}

# Host cost per decoder layer per token in eager mode (no CUDA graph: every kernel launched from
# Python). ESTIMATE carried over from another model and GPU: vLLM-Omni's Qwen2.5-Omni-7B thinker
# (28 layers) on A800 decoded at ~22-23 ms per token eager and ~13 ms with CUDA graphs
# (vllm-project/vllm-omni issue 7960): (22.5 - 13) / 28 = 0.34 ms per layer.
EAGER_LAYER_S = 0.34e-3


def get_judge(name: str) -> Judge | None:
    """The JUDGES entry of a reward model, or None for a reward model that scores in one forward."""
    return JUDGES.get(name)


def longest_answer(judge: Judge, n: int, max_tokens: int | None = None) -> float:
    """Tokens the longest of n answers runs (a batch decodes until its longest ends).

    Assumption (stated, not fitted): an answer ends with the same chance at every token
    (a memoryless length with mean answer_tokens), so the longest of n runs about
    answer_tokens x H(n), the n-th harmonic number (the exponential's largest order
    statistic), capped at max_tokens (None: no cap)."""
    if n <= 0:
        return 0.0
    h = sum(1.0 / k for k in range(1, n + 1)) if n <= 4096 else math.log(n) + 0.5772156649 + 1 / (2 * n)
    t = judge.answer_tokens * h
    return float(min(t, max_tokens) if max_tokens else t)


def get_reward(name: str) -> tuple[float, float, float]:
    """(params_B, FLOPs per sample, fixed seconds) of a reward model in REWARD_MODELS."""
    try:
        return REWARD_MODELS[name]
    except KeyError:
        raise KeyError(f"unknown reward model {name!r}; allowed: {sorted(REWARD_MODELS)}") from None


# ----------------------------------------------------------------------------- parameters and bytes

# Bytes per trainable parameter, mixed-precision AdamW (ZeRO paper, Rajbhandari et al. 2020,
# sec. 3.1): bf16 weights 2 + bf16 grads 2 + fp32 master 4 + Adam m 4 + v 4 = 16.
# LoRA adapters are kept fp32 (peft default; flow_grpo): weights 4 + grads 4 + m, v 8 = 16.
BYTES_WEIGHT, BYTES_GRAD, BYTES_OPT = 2, 2, 12
BYTES_LORA = (4, 4, 8)
DEFAULT_LORA_RANK = 32  # flow_grpo's SD3.5 LoRA rank


def lora_params_B(model: str, rank: int = DEFAULT_LORA_RANK) -> float:
    """LoRA on the attention projections: rank * (d_in + d_out) per adapted d x d matrix."""
    m = get_model(model)
    return rank * 2 * m.hidden * m.lora_mats / 1e9


def trainable_params_B(model: str, lora: bool, rank: int = DEFAULT_LORA_RANK) -> float:
    """Parameters the optimizer updates: the LoRA adapters, or the whole generator."""
    return lora_params_B(model, rank) if lora else get_model(model).params_B


# ----------------------------------------------------------------------------- links


@dataclass(frozen=True)
class Link:
    """A point-to-point path: effective GB/s per direction and per-message latency."""

    name: str
    gbps: float
    latency_s: float
    note: str = ""


# NCCL collectives reach ~80% of link peak (nccl-tests bus bandwidth); that factor is in.
LINKS = {
    lk.name: lk
    for lk in [
        Link("nvlink", 0.8 * 450.0, 10e-6, "NVLink4 (H100/H200): 900 GB/s bidirectional = 450 per direction"),
        Link("nvlink3", 0.8 * 300.0, 10e-6, "NVLink3 (A100): 600 GB/s bidirectional"),
        Link("nvlink-h800", 0.8 * 200.0, 10e-6, "NVLink on the H800: 400 GB/s bidirectional (export cap)"),
        Link("ib-400g", 0.8 * 50.0, 20e-6, "InfiniBand NDR 400 Gb/s per GPU (one NIC per GPU)"),
        Link("ib-200g", 0.8 * 25.0, 20e-6, "InfiniBand HDR 200 Gb/s per GPU"),
        Link("pcie", 55.0, 10e-6, "PCIe Gen5 x16, measured 55 GB/s pinned on the H200 (no 0.8 factor)"),
        Link("pcie4", 27.5, 10e-6, "PCIe Gen4 x16, 86% of 32 GB/s like the Gen5 measurement"),
        Link("eth-100g", 0.8 * 12.5, 50e-6, "100 Gb/s Ethernet (RoCE/TCP)"),
        Link("eth-25g", 0.8 * 3.125, 50e-6, "25 Gb/s Ethernet"),
    ]
}


def get_link(name: str | Link) -> Link:
    if isinstance(name, Link):
        return name
    try:
        return LINKS[name]
    except KeyError:
        raise KeyError(f"unknown link {name!r}; allowed: {sorted(LINKS)}") from None


# A MODELS entry belongs to the runtime family (model.name) whose `catalogue` prefix
# (digenrl.models.families) is the LONGEST one its name starts with: prefixes nest
# ("flux.2" and "flux.2-klein", "wan2.1" and "wan2.1-i2v"), and the size picks the entry.


def family_of(model: str) -> str | None:
    """The runtime family of a MODELS entry: the family whose catalogue prefix is the longest
    one `model` starts with (None: no family)."""
    best = max((f for f in FAMILIES.values() if model.startswith(f.catalogue)), key=lambda f: len(f.catalogue),
               default=None)
    return best.name if best else None


def family_models(family: str) -> list[str]:
    """The MODELS entries of a runtime family (family_of), in catalogue order."""
    return [name for name in MODELS if family_of(name) == family]

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

from dataclasses import dataclass

from digenrl.config.schema import WEIGHT_SYNC_METHODS  # noqa: F401 (priced by CostModel.weight_sync_s)

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
    ]
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; allowed: {sorted(MODELS)}") from None


def tokens_for(model: str | ModelSpec, shape: Shape | None = None) -> int:
    """Sequence length of one sample: latent patches (+ text tokens in joint attention).

    Image models: VAE /8, patch 2 -> (H/16)(W/16). Video (Wan, HunyuanVideo): causal
    VAE 4x in time, 8x in space, patch 1x2x2 -> ((F-1)/4 + 1)(H/16)(W/16). Text tokens:
    shape.text_tokens when a recipe sets its own prompt length, else the model's default.
    """
    m = get_model(model) if isinstance(model, str) else model
    s = shape or m.calib_shape
    if s.height % 16 or s.width % 16:
        raise ValueError(f"height and width must be multiples of 16 for {m.name}, got {s.height}x{s.width}")
    patches = (s.height // 16) * (s.width // 16)
    if m.kind == "video":
        if (s.frames - 1) % 4:
            raise ValueError(f"frames must be 4k+1 for {m.name} (causal video VAE), got {s.frames}")
        patches *= (s.frames - 1) // 4 + 1
    return patches + (m.text_tokens if s.text_tokens is None else s.text_tokens)


def forward_flops(model: str | ModelSpec, tokens: int) -> float:
    """FLOPs of one forward for one sample: 2 * linear params * T + 4 * d * L * T^2 (QK^T, AV)."""
    m = get_model(model) if isinstance(model, str) else model
    return 2e9 * m.tok_params_B * tokens + 4.0 * m.hidden * m.layers * tokens**2


# Text encoders: (params_B, text tokens per prompt). Only T5-XXL at 512 tokens is measured;
# the others scale that per-sample cost by params * tokens (estimated).
TEXT_ENCODERS = {
    "t5xxl": (4.762, 512),
    "t5xxl+clip-l": (4.885, 512),
    "t5xxl+clip-l+clip-g": (5.580, 333),
    "umt5-xxl": (5.680, 512),
    "qwen2.5-vl-7b": (8.290, 256),  # whole VLM resident; text-only prompts use the 7.6B LM
    "llava-llama3-8b+clip-l": (8.400, 256),
}

# Width of the text-encoder states a pipeline passes to the transformer (prompt_embeds[-1]).
TEXT_DIMS = {"t5xxl": 4096, "t5xxl+clip-l": 4096, "t5xxl+clip-l+clip-g": 4096, "umt5-xxl": 4096,
             "qwen2.5-vl-7b": 3584, "llava-llama3-8b+clip-l": 4096}
LATENT_CHANNELS = 16  # every family here: 16-channel VAE latents at 1/8 of the pixels (1/4 of the frames)

# VAEs: decoder params_B, the calibration entry whose per-pixel cost it uses, and a factor.
VAES = {
    "flux-vae": (0.084, "flux-vae", 1.0),
    "sd3-vae": (0.084, "flux-vae", 1.0),  # same 16-channel design as FLUX's
    "qwen-image-vae": (0.127, "flux-vae", 1.0),  # Wan-derived image VAE; per-pixel cost taken from flux-vae
    "wan-vae": (0.127, "wan-vae", 1.0),
    # Wan2.1 report: Wan-VAE decodes ~2.5x faster than HunyuanVideo's VAE on the same GPU.
    "hunyuan-vae": (0.246, "wan-vae", 2.5),
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
    # PaddleOCR on the host CPU (flow_grpo flow_grpo/ocr.py:9,17 use_gpu=False; mm_grpo
    # gerl/utils/reward_score/ocr.py:41 device="cpu"): no GPU work beyond the VAE decode.
    "ocr-cpu": (0.0, 0.0, 0.0),
    # Qwen3-VL-8B as an OCR judge (veRL-Omni's genrm_ocr): 8.2B LM over 256 visual tokens
    # (512x512, patch 16, 2x2 merge) + ~40 prompt + ~30 answer tokens, and the 0.58B ViT
    # over 1024 patches. ESTIMATE: the answer length is assumed (a short OCR string).
    "qwen3-vl-8b": (8.77, 2 * (8.19e9 * 326 + 0.58e9 * 1024), 10 * MS),
}
REWARD_MFU = 0.4


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


# The runtime's model.name (a diffusers family, digenrl.models.diffusers_adapters.FAMILIES)
# -> the name prefix of its entries in MODELS (the size picks the entry).
FAMILY_PREFIX = {"sd3": "sd3.5", "flux": "flux.1", "wan": "wan2.1", "qwen-image": "qwen-image",
                 "hunyuan-video": "hunyuanvideo"}

"""config.model: the policy section (ModelConfig). What a family can do is read from
digenrl.models.families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from digenrl.config.errors import check, one_of
from digenrl.models.families import EXPERT_CHOICES, FAMILIES, has, names

MODEL_NAMES = ("tiny-dit", *FAMILIES)


@dataclass
class ModelConfig:
    """The policy: which model, its weights, precision, LoRA and resolution."""

    name: str = "tiny-dit"  # the policy: tiny-dit (the toy world's small DiT, CPU) or a diffusers family
    # tiny-dit: None = the shipped toy base, else a .safetensors file; other families: a local
    # pipeline folder or a hub id ('org/name') already in the HF cache. `digenrl train` refuses
    # a path that does not exist before any work (digenrl/tools/preflight.py).
    path: Optional[str] = None
    dtype: str = "float32"  # float32 | bfloat16 | float16 (SDE math is float32 regardless)
    device: str = "cpu"  # torch device of the policy (cpu, cuda, cuda:1); Ray workers each see their own GPUs
    lora_rank: int = 16  # 0 = full fine-tune (then lower train.lr: 1e-4 for the tiny DiT)
    lora_alpha: float = 16.0  # LoRA scale numerator: the adapter's update is scaled by lora_alpha / lora_rank
    lora_targets: list[str] = field(default_factory=list)  # empty = the family's default
    grad_ckpt: bool = False  # activation (gradient) checkpointing in training: less memory, one more forward
    height: int = 0  # pixels; 0 = the model's default resolution
    width: int = 0  # pixels; 0 = the model's default resolution
    frames: int = 0  # video models only; 0 = default
    prompt_cache: Optional[str] = None  # folder of cached prompt embeddings (diffusers models)
    text_encoders: bool = True  # false: load no text encoders, every prompt must be in prompt_cache
    # text tokens per prompt (T5 / UMT5 / Llama sequence); 0 = the family's default (sd3 256,
    # flux 512, wan 512, qwen-image 256, hunyuan-video 256, flux-kontext 512, wan-i2v 512 (the
    # only length it takes), qwen-image-edit 1024). Part of the prompt cache's key.
    max_sequence_length: int = 0
    # embedded guidance scale of guidance-distilled families (flux, hunyuan-video: a model
    # input, not a CFG batch); 0 = the adapter's default 3.5. Other families refuse it.
    guidance: float = 0.0
    # two-expert families (wan2.2): which denoiser trains: both, high (the high-noise expert,
    # sigma >= the pipeline's boundary_ratio) or low; the other is frozen (no LoRA, no grad).
    # "" = both. Other families refuse it.
    experts: str = ""

    def __post_init__(self) -> None:
        one_of(self.name, "model.name", MODEL_NAMES)
        one_of(self.dtype, "model.dtype", ("float32", "bfloat16", "float16"))
        check(self.lora_rank >= 0, "model.lora_rank", f"must be >= 0 (0 = full fine-tune), got {self.lora_rank}")
        check(self.text_encoders or bool(self.prompt_cache), "model.text_encoders",
              "false needs model.prompt_cache (prompts can then only come from the cache)")
        for k in ("height", "width", "frames"):
            check(getattr(self, k) >= 0, f"model.{k}", "must be >= 0")
        check(self.max_sequence_length >= 0, "model.max_sequence_length", "must be >= 0 (0 = the family's default)")
        check(self.max_sequence_length == 0 or self.name != "tiny-dit", "model.max_sequence_length",
              "sets a diffusers family's text length; tiny-dit has its own tokenizer: leave it at 0")
        check(self.guidance >= 0, "model.guidance", "must be >= 0 (0 = the adapter's default)")
        check(self.guidance == 0 or has(self.name, "embedded_guidance"), "model.guidance",
              f"{self.name} has no embedded guidance (only {', '.join(names(embedded_guidance=True))} do); "
              "use sampling.cfg_scale for classifier-free guidance, and leave model.guidance at 0")
        check(not self.experts or has(self.name, "two_experts"), "model.experts",
              f"{self.name} has one transformer (only {', '.join(names(two_experts=True))} have two experts); "
              "leave it empty")
        if self.experts:
            one_of(self.experts, "model.experts", EXPERT_CHOICES)


"""What every diffusers adapter shares: options, loading, prompt cache, dtype boundary, training mode.

A family adapter (flux.py, sd3.py, ...) supplies four things: how to run its text
encoders (`_encode_text`), how to call its transformer with a sigma (`_forward`: packing
and the timestep convention, converted once there), how to decode (`_decode`), and its
latent geometry. Everything else lives here:

    prompts --(cache | text encoders)--> Cond (B, ...) in model dtype
    x float32 (B, *latent_shape) --cast--> transformer (model dtype) --cast--> v float32

The SDE math (digenrl.math) only ever sees float32 on both sides of that boundary.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

import torch

from digenrl.models.families import EXPERT_CHOICES, family as family_spec
from digenrl.models.empty import WeightFiles, move, params_on_meta
from digenrl.models.lora import LoraSpec, apply_lora
from digenrl.models.protocol import Cond, cond_cat, cond_repeat, merge_conds
from digenrl.models.diffusers_adapters.prompt_cache import PromptCache

log = logging.getLogger(__name__)

TRAIN_MODES = ("lora", "full", "frozen")
# Attention projections of every supported DiT (joint blocks add the add_* text-stream ones);
# peft matches them as name suffixes, and names a family lacks are simply not found.
DEFAULT_LORA_TARGETS = (
    "to_q", "to_k", "to_v", "to_out.0",
    "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
)
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


@dataclass
class AdapterOptions:
    """Options of every adapter; `load_policy(family, path, **options)` maps onto these.

    height/width/num_frames are in pixels/frames; None takes the family's default.
    dtype None: bfloat16 on CUDA, float32 on CPU. train: "full" (every weight requires grad,
    the module as loaded; a caller may still inject LoRA itself), "lora" (LoRA injected
    here, only adapters get grads), "frozen" (a rollout-only copy: nothing requires grad).
    """

    height: Optional[int] = None
    width: Optional[int] = None
    num_frames: Optional[int] = None  # video families only
    device: Optional[str] = None
    dtype: Optional[str] = None
    vae_dtype: Optional[str] = None  # None: same as dtype
    train: str = "full"
    lora_rank: int = 32
    lora_alpha: float = 64.0
    lora_targets: Optional[tuple[str, ...]] = None  # None: the family's default_lora_targets
    gradient_checkpointing: bool = False
    guidance_scale: float = 3.5  # embedded guidance (FLUX.1-dev, HunyuanVideo); ignored otherwise
    negative_prompt: str = ""
    max_sequence_length: Optional[int] = None  # text tokens; None: the family's default
    prompt_cache_dir: Optional[str] = None
    model_id: Optional[str] = None  # names the prompt-cache namespace; from_pretrained sets it
    cudnn_sdpa: bool = False  # see _guard_cudnn_sdpa
    # two-expert families (wan2.2): which denoisers train; the other is frozen (no LoRA, no grad)
    experts: str = "both"

    def __post_init__(self) -> None:
        if self.train not in TRAIN_MODES:
            raise ValueError(f"train={self.train!r} unknown; allowed: {', '.join(TRAIN_MODES)}")
        if self.experts not in EXPERT_CHOICES:
            raise ValueError(f"experts={self.experts!r} unknown; allowed: {', '.join(EXPERT_CHOICES)}")
        for name in ("dtype", "vae_dtype"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, torch.dtype) and value not in _DTYPES:
                raise ValueError(f"{name}={value!r} unknown; allowed: {', '.join(_DTYPES)}")
        for name in ("height", "width", "num_frames", "max_sequence_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.lora_targets is not None:
            self.lora_targets = tuple(self.lora_targets)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> "AdapterOptions":
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(f"unknown adapter option(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
        return cls(**kwargs)


def _as_dtype(value: Any, default: torch.dtype) -> torch.dtype:
    if value is None:
        return default
    return value if isinstance(value, torch.dtype) else _DTYPES[value]


_cudnn_guard_logged = False


def _dtype_kwarg() -> str:
    import diffusers

    major, minor = (int(p) for p in diffusers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (0, 42) else "torch_dtype"  # 0.42 deprecates torch_dtype



def _guard_cudnn_sdpa(device: torch.device, allow: bool) -> None:
    """Disable cuDNN SDPA on CUDA (process-wide).

    FLUX backward hit an illegal memory access inside cuDNN attention on torch 2.11+cu130
    (one H200, diffusers 0.42.1; fwd+bwd ran, 595 ms, once cuDNN SDPA was off). We disable it for rollout too, not only training: the rollout's
    logp_old and the trainer's logp must come from the same attention kernel, or ratio != 1.
    """
    global _cudnn_guard_logged
    if device.type != "cuda" or allow:
        return
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
        if not _cudnn_guard_logged:
            log.warning("digenrl: cuDNN SDPA disabled (FLUX backward crashed in it on torch 2.11+cu130; "
                        "pass cudnn_sdpa=True to keep it)")
            _cudnn_guard_logged = True


def cast_module(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Move and cast, keeping the modules a diffusers class lists in `_keep_in_fp32_modules`
    (Wan: rope, time embedder, norms) in float32, as `from_pretrained(torch_dtype=...)` does."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or []
    move(module, device=device, dtype=dtype)  # the plain cast (diffusers' .to() warns); meta stays meta
    if dtype != torch.float32 and keep:
        for name, sub in module.named_modules():
            if any(k in name.split(".") for k in keep):
                move(sub, dtype=torch.float32)
    return module


class DiffusersPolicy:
    """A diffusers transformer (+ VAE, + optional text encoders) behind the Policy protocol."""

    family: ClassVar[str]  # its name in digenrl.models.families, whose record sets the traits below
    pipeline_class: ClassVar[str]  # diffusers pipeline whose encode_prompt we reuse
    text_pipeline_class: ClassVar[Optional[str]] = None  # another pipeline for encode_prompt; None: pipeline_class
    text_components: ClassVar[tuple[str, ...]]  # pipeline component names of the text side
    # pipeline components that encode the conditioning image besides the VAE (Wan I2V: the
    # CLIP image encoder and its processor); loaded with the pipeline, text_encoders or not
    condition_components: ClassVar[tuple[str, ...]] = ()
    # traits, from the family's record (__init_subclass__): what conditions it (None or one of
    # protocol.CONDITIONINGS), whether the transformer takes the guidance scale as an input, a
    # high- and a low-noise transformer (wan2.2; see `experts`), "image" or "video"
    conditioning: ClassVar[Optional[str]] = None
    embedded_guidance: ClassVar[bool] = False
    two_experts: ClassVar[bool] = False
    output: ClassVar[str] = "image"
    default_size: ClassVar[tuple[int, int]] = (512, 512)  # (height, width) in pixels
    default_num_frames: ClassVar[int] = 1
    default_max_sequence_length: ClassVar[int] = 256
    default_lora_targets: ClassVar[tuple[str, ...]] = DEFAULT_LORA_TARGETS

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "family" in cls.__dict__:  # a family's class (not a shared intermediate one)
            spec = family_spec(cls.family)
            cls.conditioning, cls.embedded_guidance = spec.conditioning, spec.embedded_guidance
            cls.two_experts, cls.output = spec.two_experts, spec.output

    def __init__(
        self,
        transformer: torch.nn.Module,
        vae: Optional[torch.nn.Module] = None,
        text_modules: Optional[dict[str, Any]] = None,
        condition_modules: Optional[dict[str, Any]] = None,
        **options: Any,
    ):
        """Build from modules already in memory (tests, the GPU check, a caller's own loading).

        text_modules: the pipeline's text components by name (e.g. text_encoder, tokenizer,
        text_encoder_2, tokenizer_2 for FLUX); None when prompts come from the cache only.
        condition_modules: the family's `condition_components` by name (conditioned families).
        """
        self.options = opts = AdapterOptions.from_kwargs(options)
        self.device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = _as_dtype(opts.dtype, torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.vae_dtype = _as_dtype(opts.vae_dtype, self.dtype)
        _guard_cudnn_sdpa(self.device, opts.cudnn_sdpa)

        self.module = cast_module(transformer, self.device, self.dtype)
        # eval mode: any dropout would make the recomputed logp differ from logp_old
        self.module.eval()
        self._setup_training(opts)

        self.vae = None
        if vae is not None:
            self.vae = cast_module(vae, self.device, self.vae_dtype).eval().requires_grad_(False)
        self.text_pipeline = self._build_text_pipeline(text_modules) if text_modules else None
        self.condition_modules = dict(condition_modules or {})
        unknown = sorted(set(self.condition_modules) - set(self.condition_components))
        if unknown:
            raise ValueError(f"{self.family}: unknown condition module(s) {unknown}; "
                             f"allowed: {', '.join(self.condition_components) or 'none'}")
        for m in self.condition_modules.values():
            if isinstance(m, torch.nn.Module):
                cast_module(m, self.device, self.dtype).eval().requires_grad_(False)

        self.height = opts.height or self.default_size[0]
        self.width = opts.width or self.default_size[1]
        self.num_frames = opts.num_frames or self.default_num_frames
        self.max_sequence_length = opts.max_sequence_length or self.default_max_sequence_length
        self.latent_shape: tuple[int, ...] = self._latent_shape()

        self.model_id = opts.model_id
        self.cache: Optional[PromptCache] = None
        if opts.prompt_cache_dir is not None:
            if not self.model_id:
                raise ValueError("prompt_cache_dir needs model_id (it keys the cache); from_pretrained sets it")
            self.cache = PromptCache(opts.prompt_cache_dir, self.cache_namespace())
        self._negative: Optional[Cond] = None

    # ---- loading ---------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str,
        *,
        text_encoders: bool = True,
        local_files_only: Optional[bool] = None,
        empty_weights: bool = False,
        **options: Any,
    ) -> "DiffusersPolicy":
        """Load a diffusers pipeline folder (transformer/, vae/, text_encoder*/, tokenizer*/,
        scheduler/) or a hub id already in the local HF cache.

        text_encoders=False skips loading them: prompts must then be in the prompt cache
        (a trainer's usual setup). local_files_only None: try the local cache first, then
        the hub. empty_weights=True (a folder only): the transformer is built from its config
        with its parameters on the meta device and nothing of it is read; `weight_files` then
        names its safetensors (a sharded gang reads each rank's rows: runtime/sharded_load.py).
        """
        AdapterOptions.from_kwargs(options)  # fail on a typo before loading gigabytes
        options.setdefault("model_id", path_or_id)
        device = torch.device(options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = _as_dtype(options.get("dtype"), torch.bfloat16 if device.type == "cuda" else torch.float32)
        skip = {} if text_encoders else cls._text_components_skipped()
        weight_files = None
        if empty_weights:
            transformer, weight_files = cls._empty_transformer(path_or_id)
            skip = {**skip, "transformer": transformer}
        is_dir = os.path.isdir(path_or_id)
        attempts = [True] if (is_dir or local_files_only) else ([False] if local_files_only is False else [True, False])
        error: Optional[BaseException] = None
        for local in attempts:
            try:
                given = skip if not text_encoders else cls._text_components_loaded(path_or_id, local)
                pipe = cls._load_pipeline(path_or_id, local, dtype, given)
                break
            except (OSError, ValueError, EnvironmentError) as e:  # hub/cache misses surface as these
                error = e
        else:
            where = "the folder" if is_dir else "the local Hugging Face cache (and the hub, if reachable)"
            raise OSError(
                f"could not load {cls.family} pipeline {path_or_id!r} from {where}: {error}\n"
                f"Pass a local diffusers pipeline folder, or download it first where the hub is reachable "
                f"(`huggingface-cli download {path_or_id}`) and set HF_HOME to that cache."
            ) from error
        text = {name: getattr(pipe, name, None) for name in cls.text_components} if text_encoders else {}
        text = {name: m for name, m in text.items() if m is not None}  # a folder may ship without them
        conditions = {name: getattr(pipe, name, None) for name in cls.condition_components}
        conditions = {name: m for name, m in conditions.items() if m is not None}
        policy = cls._from_pipeline(pipe, text or None, conditions or None, options)
        if weight_files is not None:
            policy.weight_files = weight_files
        return policy

    @classmethod
    def _empty_transformer(cls, folder: str) -> tuple[torch.nn.Module, WeightFiles]:
        """The folder's transformer built from its config.json, parameters on the meta device
        (models/empty.py), and the safetensors files its weights are in."""
        import json

        import diffusers

        config = os.path.join(folder, "transformer", "config.json")
        if not os.path.isfile(config):
            raise OSError(f"{cls.family}: empty_weights needs a pipeline folder with transformer/config.json, "
                          f"got {folder!r}")
        with open(config) as f:
            model_cls = getattr(diffusers, json.load(f)["_class_name"])  # (diffusers writes it in every config)
        with params_on_meta():
            module = model_cls.from_config(model_cls.load_config(folder, subfolder="transformer"))
        return module, WeightFiles.in_folder(os.path.join(folder, "transformer"))

    @classmethod
    def _load_pipeline(cls, path_or_id: str, local: bool, dtype: torch.dtype, given: dict[str, Any]) -> Any:
        """The family's diffusers pipeline, loaded whole. `given`: components passed to it by name,
        the text components as None when text_encoders=False (_text_components_skipped), else
        those the family loads itself (_text_components_loaded, usually none). A family whose
        pipeline cannot be built here overrides it and returns an object with the same component
        attributes (cosmos_predict25.py)."""
        import diffusers

        pipeline_cls = getattr(diffusers, cls.pipeline_class)
        return pipeline_cls.from_pretrained(path_or_id, **{_dtype_kwarg(): dtype}, local_files_only=local, **given)

    @classmethod
    def _text_components_skipped(cls) -> dict[str, Any]:
        """What `from_pretrained(text_encoders=False)` passes the pipeline for its text components
        (None each; a family whose pipeline constructor reads one overrides this)."""
        return {name: None for name in cls.text_components}

    @classmethod
    def _text_components_loaded(cls, path_or_id: str, local_files_only: bool) -> dict[str, Any]:
        """Text components `from_pretrained(text_encoders=True)` loads itself and passes the
        pipeline, by name (none: the pipeline loads them all; see qwen_image_edit.py)."""
        return {}

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        """Build from a loaded diffusers pipeline; families with more denoisers (wan2.2) override it."""
        return cls(pipe.transformer, pipe.vae, text_modules=text_modules, condition_modules=condition_modules,
                   **options)

    def _build_text_pipeline(self, text_modules: dict[str, Any]) -> Any:
        """The family's diffusers pipeline holding only its text side: we call its encode_prompt."""
        import diffusers

        self._prepare_text_modules(text_modules)
        pipeline_cls = getattr(diffusers, self.text_pipeline_class or self.pipeline_class)
        return pipeline_cls(transformer=None, vae=None, scheduler=None, **text_modules)

    def _prepare_text_modules(self, text_modules: dict[str, Any]) -> None:
        """Refuse a text module the family does not have; put its modules on the device, frozen
        (what every family's _build_text_pipeline does first)."""
        unknown = sorted(set(text_modules) - set(self.text_components))
        if unknown:
            allowed = ", ".join(self.text_components)
            raise ValueError(f"{self.family}: unknown text module(s) {unknown}; allowed: {allowed}")
        for m in text_modules.values():
            if isinstance(m, torch.nn.Module):
                m.to(self.device).eval().requires_grad_(False)

    # ---- training mode ---------------------------------------------------------------

    def _setup_training(self, opts: AdapterOptions) -> None:
        if opts.experts != "both" and not self.two_experts:
            raise ValueError(f"{self.family}: experts={opts.experts!r} applies to two-expert families only "
                             f"(wan2.2); {self.family} has one transformer")
        trained = self.trained_module()
        self.module.requires_grad_(False)
        if opts.train == "lora":
            spec = LoraSpec(rank=opts.lora_rank, alpha=opts.lora_alpha,
                            target_modules=opts.lora_targets or self.default_lora_targets)
            apply_lora(trained, spec)
            # peft creates adapter weights in float32; keep them in the model dtype so the
            # forward runs one dtype (the optimizer may keep float32 master copies itself)
            cast_module(self.module, self.device, self.dtype)
        else:
            trained.requires_grad_(opts.train == "full")
        if opts.gradient_checkpointing:
            self.module.enable_gradient_checkpointing()

    def trained_module(self) -> torch.nn.Module:
        """The part of `self.module` RL trains: LoRA goes in here, the rest stays frozen.
        The whole module, except for two-expert families with `experts` high or low."""
        return self.module

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    # ---- prompts ---------------------------------------------------------------------

    def cache_namespace(self) -> str:
        """Everything that changes a prompt's embedding: the cache key's prefix."""
        return f"{self.family}|{self.model_id}|max_seq={self.max_sequence_length}"

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        """Prompts -> Cond (B, ...) on the policy's device, through the cache when there is one."""
        prompts = list(prompts)
        if not prompts:
            raise ValueError("encode_prompts needs at least one prompt")
        if self.cache is None:
            cond = self._encode_with_text_encoders(prompts)
        else:
            rows = {p: self.cache.get(p) for p in dict.fromkeys(prompts)}
            todo = [p for p, c in rows.items() if c is None]
            if todo:
                fresh = self._encode_with_text_encoders(todo)
                for i, p in enumerate(todo):
                    row = {k: v[i : i + 1] for k, v in fresh.items()}
                    self.cache.put(p, row)
                    rows[p] = row
            cond = cond_cat([{k: v.to(self.device) for k, v in rows[p].items()} for p in prompts])
        cond = {k: v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device)
                for k, v in cond.items()}
        return self._add_extras(cond)

    def precompute_prompts(self, prompts: Sequence[str], batch_size: int = 16) -> int:
        """Fill the prompt cache (run where the text encoders are loaded); returns how many were new."""
        if self.cache is None:
            raise RuntimeError("precompute_prompts needs prompt_cache_dir (and model_id) set")
        todo = self.cache.missing(prompts)
        for i in range(0, len(todo), batch_size):
            self.encode_prompts(todo[i : i + batch_size])
        return len(todo)

    # ---- conditioning images (edit, image-to-video) --------------------------------

    def encode_inputs(self, prompts: Sequence[str], images: torch.Tensor) -> Cond:
        """Prompts + one image each -> one Cond (protocol.encode_inputs checks the inputs)."""
        return merge_conds(self.encode_prompts(prompts), self.encode_conditions(images))

    def encode_conditions(self, images: torch.Tensor) -> Cond:
        """Images (B, 3, H, W) in [0, 1] -> the family's conditioning entries (B, ...)."""
        raise TypeError(f"{self.family} takes prompts only; it has no conditioning image")

    def _condition_pixels(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, 3, height, width) in [-1, 1], VAE dtype, on device.

        Resized (bicubic, antialiased) to the output size when it differs: every row's
        conditioning entries then have one shape and concatenate. The diffusers pipelines
        resize a reference to their own preferred size instead (Kontext, Qwen-Image-Edit:
        ~1 MP at its aspect ratio); data loading (digenrl.data) resizes to the output size.
        """
        if self.vae is None:
            raise RuntimeError(f"{self.family}: no VAE loaded; encoding a conditioning image needs one")
        x = images.to(self.device, torch.float32)
        if tuple(x.shape[-2:]) != (self.height, self.width):
            x = torch.nn.functional.interpolate(x, size=(self.height, self.width), mode="bicubic",
                                                antialias=True, align_corners=False).clamp(0.0, 1.0)
        return (x * 2.0 - 1.0).to(self.vae_dtype)  # VaeImageProcessor.normalize: 2x - 1

    def negative_cond(self, batch: int) -> Cond:
        if self._negative is None:
            self._negative = self.encode_prompts([self.options.negative_prompt])
        return cond_repeat(self._negative, batch)

    def _encode_with_text_encoders(self, prompts: list[str]) -> Cond:
        if self.text_pipeline is None:
            where = f" in the prompt cache at {self.cache.root}" if self.cache is not None else ""
            raise RuntimeError(
                f"{self.family}: no text encoder loaded and {len(prompts)} prompt(s) not found{where}, "
                f"e.g. {prompts[0]!r}. Encode them first where the text encoders are loaded "
                f"(policy.precompute_prompts(prompts) with the same prompt_cache_dir and model_id)."
            )
        with torch.no_grad():
            return self._encode_text(prompts)

    def _add_extras(self, cond: Cond) -> Cond:
        """Non-text entries: the embedded guidance scale of guidance-distilled families
        (FLUX.1-dev, HunyuanVideo) when their transformer has `guidance_embeds`."""
        if self.embedded_guidance and self.module.config.guidance_embeds:
            b = cond["prompt_embeds"].shape[0]
            cond["guidance"] = torch.full((b,), float(self.options.guidance_scale), device=self.device)
        return cond

    # ---- the velocity field ----------------------------------------------------------

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v ~ eps - x0 at x (B, *latent_shape), sigma (B,) in [0, 1]; float32 out."""
        if tuple(x.shape[1:]) != self.latent_shape:
            raise ValueError(f"{self.family}: x has shape {tuple(x.shape)}, expected (B, *{self.latent_shape})")
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=self.device)
        if sigma.ndim == 0:
            sigma = sigma.expand(x.shape[0])
        if sigma.shape != (x.shape[0],):
            raise ValueError(f"sigma must be a float or a ({x.shape[0]},) tensor, got shape {tuple(sigma.shape)}")
        v = self._forward(x.to(self.device, self.dtype), sigma, cond)
        return v.float()

    def enable_sequence_parallel(self, group, counter=None):
        """Run every forward of the transformer sequence-parallel over `group` (a
        torch.distributed group whose ranks call each forward together; video families:
        digenrl.models.sequence_parallel). Call before FSDP sharding. Returns the state."""
        from digenrl.models.sequence_parallel import SequenceParallel, enable

        return enable(self.module, SequenceParallel(group, counter))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents (B, *latent_shape) -> float32 pixels in [0, 1]."""
        if self.vae is None:
            raise RuntimeError(f"{self.family}: no VAE loaded; decode needs one")
        with torch.no_grad():
            pixels = self._decode(latents.to(self.device, self.vae_dtype))
        return (pixels.float() / 2 + 0.5).clamp(0.0, 1.0)  # VAEs decode to [-1, 1]

    # ---- per family ------------------------------------------------------------------

    def _latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def _encode_text(self, prompts: list[str]) -> Cond:
        raise NotImplementedError

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        raise NotImplementedError

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def pad_tokens(t: torch.Tensor, length: int, *, uncut: str | None = None) -> torch.Tensor:
    """Zero-pad (or cut) dim 1 of (B, L, ...) to `length`: every batch gets one fixed text length,
    so conditions concatenate and an embedding never depends on its batch-mates. uncut: the
    family, for a pipeline that keeps every text token (no length limit of its own): a longer
    embedding is then an error naming model.max_sequence_length, not silently cut."""
    if uncut is not None and t.shape[1] > length:
        raise ValueError(f"{uncut}: a prompt encodes to {t.shape[1]} tokens, more than model.max_sequence_length="
                         f"{length}; the pipeline keeps every one (a reference image's tokens count too): raise "
                         f"model.max_sequence_length to at least {t.shape[1]}")
    if t.shape[1] >= length:
        return t[:, :length]
    pad = t.new_zeros((t.shape[0], length - t.shape[1], *t.shape[2:]))
    return torch.cat([t, pad], dim=1)

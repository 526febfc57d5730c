"""Cosmos-Predict2.5 text-to-world (CosmosTransformer3DModel): Wan2.1-VAE video latents, Qwen2.5-VL
text (every layer's hidden states, normalised and concatenated).

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/cosmos/pipeline_cosmos2_5_predict.py
(those marked "transformer": src/diffusers/models/transformers/transformer_cosmos.py):
- text-to-world only. The pipeline has three paths; text-to-world is `num_frames_in = 0`
  (750-751): `prepare_latents` then returns pure noise, an all-zero condition mask (B, 1, T, H, W),
  an all-zero frame indicator and zero condition latents (437-451), so `in_latents` is the
  latents (795) and `noise_pred = gt_velocity + noise_pred * (1 - cond_mask)` is the plain model
  output (778, 807). Image-/video-to-world pin their conditioning frames instead (their velocity
  replaced by the clean one, 807; their timestep 1e-4, 789-792): not built.
- timestep: the transformer gets the scheduler's sigma itself, broadcast to (B, 1, T, 1, 1)
  (787-792: "assumes sigma(t) in [0, 1]"), float32; its time projection (`Timesteps`, transformer
  73) takes it unscaled. So the model input is sigma (no * 1000). We pass it as (B,), which the
  transformer also takes (transformer 759-760): text-to-world gives every frame the same sigma, and the
  (B, 1, T, 1, 1) form expands the time embedding to every token (transformer 761-773), so each block's adaLN
  MLPs (~9% of a 2B block's linear weights) would run per token instead of once per sample. Same
  values; the test compares with the pipeline's own (B, 1, T, 1, 1) call.
- sign: the released scheduler is UniPC with `prediction_type="flow_prediction"`, whose x0 is
  `sample - sigma * model_output`: the output is the flow velocity eps - x0. We only take its
  sigma grid (`sampling.sigmas=diffusers`, sigmas.py); our steps stay Euler/SDE.
- transformer inputs: besides the latents, `condition_mask` (concatenated as one channel:
  in_channels = latent channels + 1; zeros for text-to-world) and `padding_mask` (1, 1, height,
  width) in pixels (770; zeros), which the transformer resizes to the latent grid with
  torchvision (transformer 734-740) and concatenates as another channel when
  `concat_padding_mask`. torchvision is therefore needed at run time; the load refuses without it.
- text: `_get_prompt_embeds` (254-321) renders a chat template (a fixed system message + the
  prompt), pads/cuts to max_sequence_length (512) tokens, runs the Qwen2.5-VL language model
  with no attention mask, and concatenates the hidden states of every layer after the
  embeddings (1..N), each normalised to zero mean / unit std over its features: (B, L, N * D),
  for the released 7B text encoder 28 x 3584 = 100352 (the transformer's `crossattn_proj_in_channels`,
  projected to 1024 inside the transformer). Only the tokenizer and the language model run (no
  image processor). We call that method itself on an object holding only the tokenizer and the
  text encoder: the pipeline's constructor needs a VAE and a safety checker.
- CFG: `cond + g * (cond - neg)` (820), i.e. `neg + (1 + g) * (cond - neg)`: our `guided_velocity`
  with sampling.cfg_scale = 1 + guidance_scale (the pipeline's default 7.0 -> 8.0).
  Deviation: the pipeline's default negative prompt is its DEFAULT_NEGATIVE_PROMPT (63-70);
  ours is model options' negative_prompt ("" by default).
- decode: `latents / (1 / std) + mean` per channel (241-242, 844-846), i.e. latents * std + mean,
  as Wan; vae.decode gives (B, 3, F, H, W). num_frames - 1 must be a multiple of the VAE's
  temporal factor 4 (the released 93 is), so no `_match_num_frames` padding applies.
- no safety checker: the pipeline's constructor builds a CosmosSafetyChecker (219-224), which
  needs the `cosmos_guardrail` package, and its `__call__` refuses to run without one (653-658).
  We never build the pipeline: the transformer, VAE, tokenizer and text encoder are loaded one
  by one from the folder. Our samples therefore get no guardrail (no prompt text check, no
  video check/blur on decode); rollouts feed rewards only.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from digenrl.models.diffusers_adapters.base import DiffusersPolicy
from digenrl.models.diffusers_adapters.wan import decode_wan_vae
from digenrl.models.protocol import Cond

_PIXEL_MULTIPLE = 16  # check_inputs (502)


def refuse_without_torchvision() -> None:
    """The transformer resizes its padding mask with torchvision (`transforms`, imported only when
    torchvision is installed, transformer_cosmos.py:31-32); without it every forward fails."""
    from diffusers.models.transformers import transformer_cosmos

    if getattr(transformer_cosmos, "transforms", None) is None:
        raise ImportError("cosmos-predict2.5: the Cosmos transformer resizes its padding mask with torchvision, "
                          "which is not installed; pip install torchvision (the build matching your torch)")


class _TextSide:
    """What the pipeline's `_get_prompt_embeds` reads from `self`: the tokenizer and the text encoder."""

    def __init__(self, tokenizer: Any, text_encoder: Any):
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder


class CosmosPredict25Policy(DiffusersPolicy):
    family = "cosmos-predict2.5"
    pipeline_class = "Cosmos2_5_PredictBasePipeline"
    text_components = ("text_encoder", "tokenizer")
    default_size = (704, 1280)  # the pipeline's __call__ defaults (552-554)
    default_num_frames = 93
    default_max_sequence_length = 512
    # attn1 (self) and attn2 (cross): to_q/k/v, to_out.0 each
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")

    # ---- loading: the components one by one (no pipeline, so no safety checker) -------

    @classmethod
    def _load_pipeline(cls, path_or_id: str, local: bool, dtype: torch.dtype, given: dict[str, Any]) -> Any:
        from types import SimpleNamespace

        from diffusers import AutoencoderKLWan, CosmosTransformer3DModel
        from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

        from digenrl.models.diffusers_adapters.base import _dtype_kwarg

        common = dict(local_files_only=local)
        given = dict(given)
        transformer = given.pop("transformer", None)  # from_pretrained(empty_weights=True): built already
        parts: dict[str, Any] = {
            "transformer": transformer if transformer is not None else CosmosTransformer3DModel.from_pretrained(
                path_or_id, subfolder="transformer", **{_dtype_kwarg(): dtype}, **common),
            "vae": AutoencoderKLWan.from_pretrained(path_or_id, subfolder="vae", **{_dtype_kwarg(): dtype}, **common),
        }
        if not given:  # text_encoders=True (this family loads no text component itself); a folder may ship without them
            sub = (lambda name: os.path.join(path_or_id, name)) if os.path.isdir(path_or_id) else None
            for name, load in (("tokenizer", lambda where, **kw: AutoTokenizer.from_pretrained(where, **kw)),
                               ("text_encoder", lambda where, **kw: Qwen2_5_VLForConditionalGeneration.from_pretrained(
                                   where, dtype=dtype, **kw))):
                if sub is not None:
                    if os.path.isdir(sub(name)):
                        parts[name] = load(sub(name), **common)
                else:
                    parts[name] = load(path_or_id, subfolder=name, **common)
        return SimpleNamespace(config={}, **parts)

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        refuse_without_torchvision()
        cfg = pipe.transformer.config
        if cfg.get("img_context_dim_in"):
            raise ValueError("cosmos-predict2.5: this transformer takes an image context (img_context_dim_in: "
                             "Cosmos-Transfer2.5 layout), which the text-to-world path does not feed")
        if cfg.get("controlnet_block_every_n"):
            raise ValueError("cosmos-predict2.5: this transformer takes ControlNet residuals "
                             "(controlnet_block_every_n: Cosmos-Transfer2.5), which are not supported")
        if pipe.vae is not None and type(pipe.vae).__name__ != "AutoencoderKLWan":
            raise ValueError(f"cosmos-predict2.5: only the Wan2.1 VAE (AutoencoderKLWan) is supported, "
                             f"this folder has {type(pipe.vae).__name__}")
        return super()._from_pipeline(pipe, text_modules, condition_modules, options)

    def _build_text_pipeline(self, text_modules: dict[str, Any]) -> Any:
        self._prepare_text_modules(text_modules)
        missing = sorted(set(self.text_components) - set(text_modules))
        if missing:
            raise ValueError(f"{self.family}: text module(s) {missing} missing (the tokenizer and the text encoder "
                             f"are used together)")
        return _TextSide(text_modules["tokenizer"], text_modules["text_encoder"])

    # ---- geometry ------------------------------------------------------------------

    def _latent_shape(self) -> tuple[int, ...]:
        in_channels = self.module.config.in_channels
        if self.vae is not None:  # the pipeline's factors (235-236)
            down = list(self.vae.temperal_downsample)
            channels, t, s = self.vae.config.z_dim, 2 ** sum(down), 2 ** len(down)
            if in_channels != channels + 1:
                raise ValueError(f"cosmos-predict2.5: the transformer takes {in_channels} channels, expected the "
                                 f"VAE's {channels} + 1 (the condition mask)")
        else:
            channels, t, s = in_channels - 1, 4, 8
        _, ph, pw = self.module.config.patch_size
        if (self.num_frames - 1) % t:
            raise ValueError(f"cosmos-predict2.5: num_frames - 1 must be a multiple of {t}, got num_frames={self.num_frames}")
        m = max(_PIXEL_MULTIPLE, s * ph, s * pw)
        if self.height % m or self.width % m:
            raise ValueError(f"cosmos-predict2.5: height and width must be multiples of {m}, got {self.height}x{self.width}")
        return (channels, (self.num_frames - 1) // t + 1, self.height // s, self.width // s)

    # ---- text, velocity, decode ---------------------------------------------------

    def _encode_text(self, prompts: list[str]) -> Cond:
        import diffusers

        pipeline_cls = getattr(diffusers, self.pipeline_class)
        embeds = pipeline_cls._get_prompt_embeds(  # the pipeline's own text path, see module docstring
            self.text_pipeline, prompt=list(prompts), max_sequence_length=self.max_sequence_length,
            device=self.device, dtype=self.dtype,
        )
        return {"prompt_embeds": embeds}  # (B, max_sequence_length, N * D)

    def _forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        b, _, f, h, w = x.shape
        return self.module(
            hidden_states=x,  # (B, C, F, H, W)
            condition_mask=x.new_zeros((b, 1, f, h, w)),  # text-to-world: nothing pinned
            timestep=sigma,  # (B,): the input is sigma, one per sample (module docstring)
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            padding_mask=x.new_zeros((1, 1, self.height, self.width)),
            return_dict=False,
        )[0]

    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        return decode_wan_vae(self.vae, latents)

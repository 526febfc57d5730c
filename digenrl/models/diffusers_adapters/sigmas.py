"""The sigma grid a family's diffusers pipeline samples on (`sampling.sigmas=diffusers`).

    scheduler = load_scheduler("flux", "/models/FLUX.1-dev")      # the folder's scheduler config
    sigmas = pipeline_sigmas("flux", 6, scheduler, latent_hw=(64, 64))  # float32 (7,), ends in 0

DigenRL's own grid (digenrl.math.sigma_schedule) is shift(linspace(1, 0, N+1)). Each diffusers
pipeline asks its scheduler for a different one, and the peers (flow_grpo, DanceGRPO) sample
on whatever the pipeline asks for. We do not re-derive those formulas: we call the family's
scheduler (its class and config from the pipeline folder's scheduler/scheduler_config.json)
the way its diffusers pipeline calls it, and read `scheduler.sigmas` back. The diffusers
citations below are line numbers in diffusers@v0.42.1, paths under src/diffusers/pipelines/; the
flow_grpo ones in zhtmike/flow_grpo@9745241 (a fork of yifan123/flow_grpo, at its merged
pull request 175), files under flow_grpo/diffusers_patch/:

  sd3            set_timesteps(N) (no sigmas; mu only under use_dynamic_shifting)
                 stable_diffusion_3/pipeline_stable_diffusion_3.py:1014-1041. flow_grpo's SD3 sampler does the
                 same (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py:120-128).
                 SD3.5 (shift 3, 10 steps): shift(linspace(1, t_min, 10)) + [0], with
                 t_min = shift(1/1000) = 0.002994 the scheduler's own sigma_min, so the last
                 noisy sigma is shift(t_min) = 0.0089.
  flux           sigmas = linspace(1, 1/N, N), mu = calculate_shift(image tokens) (the
                 resolution-dependent "dynamic" shift exp(mu)); flux/pipeline_flux.py:823-842,
                 the same in flow_grpo/diffusers_patch/flux_pipeline_with_logprob.py:110-127.
  qwen-image     as flux, with its own shift bounds and shift_terminal;
                 qwenimage/pipeline_qwenimage.py:598-612 (flow_grpo qwenimage_pipeline_with_logprob.py:98-113).
  wan            set_timesteps(N) on the folder's scheduler, which for Wan2.1 is
                 UniPCMultistepScheduler with flow sigmas (wan/pipeline_wan.py:554; flow_grpo
                 wan_pipeline_with_logprob.py:229). We only take its grid: our steps stay Euler/SDE.
  hunyuan-video  sigmas = linspace(1, 0, N+1)[:-1], static shift from the config (7.0 for
                 hunyuanvideo-community/HunyuanVideo); hunyuan_video/pipeline_hunyuan_video.py:635-642.

  flux2          as flux, but mu = compute_empirical_mu(image tokens, N), a fit in both the
                 token count and the step count; flux2/pipeline_flux2.py:935-946.
  qwen-image-2.1 the pipeline's own `sample_sigmas` (model_index.json) when set (then the step
                 count is theirs), else linspace(1, 1/N, N); mu from the image tokens (one per
                 16x16 pixels) with qwen-image's formula; qwenimage21/pipeline_qwenimage21.py:731-745.
  hunyuan-video-1.5
                 as hunyuan-video; hunyuan_video1_5/pipeline_hunyuan_video1_5.py:703-704.
  sana, sana-video
                 set_timesteps(N) on the folder's scheduler (DPM-Solver / UniPC with flow sigmas
                 in the released checkpoints); sana/pipeline_sana.py:880-882,
                 sana_video/pipeline_sana_video.py:913-915.

  cosmos-predict2.5
                 set_timesteps(N) on the folder's scheduler (cosmos/pipeline_cosmos2_5_predict.py:773), for the
                 released model UniPC with Karras sigmas in [0.01, 200] mapped to flow sigmas s / (1 + s)
                 (diffusers scripts/convert_cosmos_to_diffusers.py, save_pipeline_cosmos2_5_predict): the
                 grid starts at 200/201 = 0.995 and its last noisy sigma is 0.0099.

  flux-kontext, qwen-image-edit, wan-i2v: their base family's code exactly
                 (flux/pipeline_flux_kontext.py:965-980 and qwenimage/pipeline_qwenimage_edit.py:720-735
                 compute mu from the sample's own tokens, not the reference's;
                 wan/pipeline_wan_i2v.py:708 calls set_timesteps(N)).

Without a readable pipeline folder (a hub id not in the cache, emulated compute) the family's
published scheduler config (its `Family.scheduler` in digenrl.models.families) is used, with a
warning. The families with a `grid_rule` and no `scheduler` there (flux2, qwen-image-2.1, sana,
sana-video, hunyuan-video-1.5, ltx2, cosmos-predict2.5) have none recorded (their configs could not be read
offline; cosmos-predict2.5's converter config above is not the hub folder's): they need the
folder's own.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

import numpy as np
import torch

from digenrl.models.families import grid_family, names

log = logging.getLogger(__name__)

# The defaults each pipeline's `scheduler.config.get(key, default)` falls back on when computing
# mu (diffusers@v0.42.1 src/diffusers/pipelines/stable_diffusion_3/pipeline_stable_diffusion_3.py:1021-1027
# has max_shift 1.16; the others 1.15).
_MU_DEFAULTS = {
    "sd3": (256, 4096, 0.5, 1.16),
    "flux": (256, 4096, 0.5, 1.15),
    "qwen-image": (256, 4096, 0.5, 1.15),
}


def load_scheduler(family: str, path: Optional[str]):
    """The family's diffusers scheduler, configured from `path` (a pipeline folder, or a hub id
    in the local HF cache) as the pipeline's from_pretrained builds it: the class model_index.json
    names, the config of scheduler/scheduler_config.json. The published config when `path` is
    None or has no scheduler."""
    import diffusers

    spec = grid_family(family)
    family = spec.name
    if not spec.grid:
        raise ValueError(f"no diffusers sigma grid for family {family!r}; allowed: {', '.join(names(grid=True))}")
    found = _read_scheduler_config(path) if path else None
    if found is None and spec.scheduler is None:
        raise ValueError(f"sampling.sigmas=diffusers for {family} reads the scheduler config of the pipeline "
                         f"folder (model.path), and none is readable at {path!r} (no published config is "
                         f"recorded for {family}); use sampling.sigmas=digenrl or a local pipeline folder")
    if found is None:
        if path:
            log.warning("digenrl: no scheduler config readable at %r; sampling.sigmas=diffusers uses %s's "
                        "published one", path, family)
        config = spec.scheduler
        class_name = config["_class_name"]
    else:
        config, class_name = found
    return getattr(diffusers, class_name).from_config(config)


def _read_scheduler_config(path: str) -> Optional[tuple[dict, str]]:
    """(config, class name) of the folder's scheduler, or None."""
    local = os.path.join(path, "scheduler", "scheduler_config.json")
    if os.path.isfile(local):
        with open(local) as f:
            config = json.load(f)
        index = os.path.join(path, "model_index.json")
        class_name = config.get("_class_name")
        if os.path.isfile(index):  # from_pretrained takes the class from here, not from the config
            with open(index) as f:
                class_name = json.load(f).get("scheduler", [None, class_name])[1]
        return config, class_name
    if os.path.isdir(path):
        return None
    try:  # a hub id: only what the local HF cache holds (never a download from the driver)
        from diffusers import DiffusionPipeline, FlowMatchEulerDiscreteScheduler

        config = dict(FlowMatchEulerDiscreteScheduler.load_config(path, subfolder="scheduler", local_files_only=True))
        index = DiffusionPipeline.load_config(path, local_files_only=True)
        return config, index.get("scheduler", [None, config.get("_class_name")])[1]
    except (OSError, ValueError, EnvironmentError):
        return None


def _vae_config(path: Optional[str]) -> dict[str, Any]:
    """The folder's vae/config.json ({} without one)."""
    cfg_path = os.path.join(path, "vae", "config.json") if path else ""
    if not os.path.isfile(cfg_path):
        return {}
    with open(cfg_path) as f:
        return json.load(f)


def vae_factor(path: Optional[str]) -> int:
    """Pixels per latent along height/width, from the folder's vae/config.json as the adapters
    compute it (AutoencoderKL: 2**(blocks-1); Qwen-Image/Wan VAEs: 2**len(temperal_downsample));
    8, every released family's factor, when the folder has none."""
    cfg = _vae_config(path)
    if not cfg:
        return 8
    if "spatio_temporal_scaling" in cfg:  # LTX-2 (AutoencoderKLLTX2Video: patch_size * 2**sum(scaling))
        return int(cfg.get("spatial_compression_ratio") or cfg["patch_size"] * 2 ** sum(cfg["spatio_temporal_scaling"]))
    if "spatial_compression_ratio" in cfg:  # HunyuanVideo
        return int(cfg["spatial_compression_ratio"])
    if "scale_factor_spatial" in cfg:  # Wan, Qwen-Image 2.1 (16: the pipeline's own constant)
        return int(cfg["scale_factor_spatial"])
    if "encoder_block_out_channels" in cfg:  # SANA's DC-AE
        return 2 ** (len(cfg["encoder_block_out_channels"]) - 1)
    if "block_out_channels" in cfg:
        return 2 ** (len(cfg["block_out_channels"]) - 1)
    if "temperal_downsample" in cfg:
        return 2 ** len(cfg["temperal_downsample"])
    return 8


def vae_temporal_factor(path: Optional[str], default: int) -> int:
    """Frames per latent frame of an LTX-2 video VAE (vae/config.json), `default` without one."""
    cfg = _vae_config(path)
    if "spatio_temporal_scaling" not in cfg:
        return default
    return int(cfg.get("temporal_compression_ratio")
               or cfg.get("patch_size_t", 1) * 2 ** sum(cfg["spatio_temporal_scaling"]))


def sample_sigmas(path: Optional[str]) -> Optional[list[float]]:
    """The pipeline's own `sample_sigmas` (model_index.json; Qwen-Image 2.1), or None."""
    index = os.path.join(path, "model_index.json") if path else ""
    if not os.path.isfile(index):
        return None
    with open(index) as f:
        return json.load(f).get("sample_sigmas")


def pipeline_sigmas(family: str, num_steps: int, scheduler, latent_hw: tuple[int, int],
                    fixed_sigmas: Optional[list[float]] = None, latent_frames: int = 1) -> torch.Tensor:
    """float32 (num_steps + 1,): the `scheduler.sigmas` the family's diffusers 0.42 pipeline
    sets for `num_steps` steps at latent size `latent_hw` (what the dynamic shift reads);
    the last entry is 0. `scheduler` is mutated (set_timesteps), as the pipeline would.
    fixed_sigmas: qwen-image-2.1's `sample_sigmas` (see `sample_sigmas`), used instead of the
    linspace when set. latent_frames: the video's latent frames (ltx2's shift reads
    frames x height x width tokens)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    h, w = latent_hw
    spec = grid_family(family)
    family, rule = spec.name, spec.grid_rule  # the rules: digenrl.models.families.GRID_RULES
    cfg = scheduler.config
    if rule == "set-timesteps":
        kwargs = {}
        if family == "sd3" and cfg.get("use_dynamic_shifting", None):
            kwargs["mu"] = _mu(family, cfg, (h // 2) * (w // 2))  # SD3 patch size 2
        scheduler.set_timesteps(num_steps, **kwargs)
    elif rule == "dynamic-shift":
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        if family == "flux" and getattr(cfg, "use_flow_sigmas", False):
            sigmas = None
        mu = _mu(family, cfg, (h // 2) * (w // 2))  # 2x2-packed latent tokens: latents.shape[1]
        _retrieve(family, scheduler, num_steps, sigmas, mu=mu)
    elif rule == "empirical-mu":
        from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

        sigmas = None if getattr(cfg, "use_flow_sigmas", False) else np.linspace(1.0, 1 / num_steps, num_steps)
        mu = compute_empirical_mu(image_seq_len=(h // 2) * (w // 2), num_steps=num_steps)  # 2x2-patchified tokens
        _retrieve(family, scheduler, num_steps, sigmas, mu=mu)
    elif rule == "sample-sigmas":
        if fixed_sigmas is not None and len(fixed_sigmas) != num_steps:
            raise ValueError(f"{family}: the pipeline's sample_sigmas fix {len(fixed_sigmas)} steps; "
                             f"sampling.num_steps is {num_steps}")
        sigmas = fixed_sigmas if fixed_sigmas is not None else np.linspace(1.0, 1 / num_steps, num_steps)
        _retrieve(family, scheduler, num_steps, sigmas, mu=_mu("qwen-image", cfg, h * w))  # unpacked tokens
    elif rule == "video-token-shift":
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        # diffusers@v0.42.1 src/diffusers/pipelines/ltx2/pipeline_ltx2.py:1345-1370: linspace(1, 1/N, N),
        # mu from the packed video tokens (patch 1) with its own defaults (1024, 4096, 0.95, 2.05)
        mu = calculate_shift(latent_frames * h * w, cfg.get("base_image_seq_len", 1024),
                             cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.95),
                             cfg.get("max_shift", 2.05))
        _retrieve(family, scheduler, num_steps, np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    elif rule == "static-shift":
        _retrieve(family, scheduler, num_steps, np.linspace(1.0, 0.0, num_steps + 1)[:-1])
    else:
        raise ValueError(f"no diffusers sigma grid for family {family!r}; allowed: {', '.join(names(grid=True))}")
    sigmas = scheduler.sigmas.detach().to("cpu", torch.float32)
    if sigmas.shape != (num_steps + 1,) or sigmas[-1] != 0:
        raise ValueError(f"{family}: the scheduler set {tuple(sigmas.shape)} sigmas ending in {float(sigmas[-1])}; "
                         f"expected {num_steps + 1} ending in 0")
    return sigmas


def _mu(family: str, cfg, image_seq_len: int) -> float:
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    base_len, max_len, base_shift, max_shift = _MU_DEFAULTS[family]
    return calculate_shift(
        image_seq_len,
        cfg.get("base_image_seq_len", base_len),
        cfg.get("max_image_seq_len", max_len),
        cfg.get("base_shift", base_shift),
        cfg.get("max_shift", max_shift),
    )


def _retrieve(family: str, scheduler, num_steps: int, sigmas, **kwargs) -> None:
    """The pipeline module's own retrieve_timesteps (it passes sigmas without num_steps)."""
    import importlib

    module = {"flux": "flux.pipeline_flux", "qwen-image": "qwenimage.pipeline_qwenimage",
              "hunyuan-video": "hunyuan_video.pipeline_hunyuan_video", "flux2": "flux2.pipeline_flux2",
              "qwen-image-2.1": "qwenimage21.pipeline_qwenimage21",
              "hunyuan-video-1.5": "hunyuan_video1_5.pipeline_hunyuan_video1_5",
              "ltx2": "ltx2.pipeline_ltx2"}[family]
    retrieve = importlib.import_module(f"diffusers.pipelines.{module}").retrieve_timesteps
    retrieve(scheduler, num_steps, "cpu", sigmas=sigmas, **kwargs)

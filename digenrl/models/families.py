"""Every diffusers family DigenRL runs, declared once.

    from digenrl.models.families import FAMILIES, family, names
    family("wan2.2").two_experts          # True
    names(output="video")                 # the video families, in declaration order
    names(conditioning="first-frame")     # Wan2.1 I2V, HunyuanVideo 1.5 I2V

A `Family` holds what the rest of the package asks about a family: where its adapter class
is, what it generates, what conditions it, which of the adapter's options it has, how its
sampling grid is built, and where the simulator and the recipes find it. The config checks,
the sigma grids, the simulator's catalogue, the profile targets and the tests read these
records; the adapter classes (`diffusers_adapters.base.DiffusersPolicy`) take their traits
from them. Nothing here imports torch or diffusers, so the config can be validated on a
machine without either.

Adding a family (docs/guides/models.md has the whole checklist): its adapter module under
`diffusers_adapters/`, one `Family` below, a tiny-pipeline builder in one of the tables of
`tests/models/tiny_diffusers*.py`, a recipe in `recipes/`, a cost entry in
`digenrl/sim/catalogue.py` (MODELS, named with `catalogue` as prefix).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

CONDITIONINGS = ("reference-image", "first-frame")  # what one image per prompt is to the model
OUTPUTS = ("image", "video")
EXPERT_CHOICES = ("both", "high", "low")  # the trained expert(s) of a two-expert family (model.experts)
# how a pipeline asks its scheduler for the sigma grid (diffusers_adapters/sigmas.py pipeline_sigmas):
# set_timesteps(N) alone; linspace(1, 1/N, N) with a dynamic shift mu from the image tokens; the
# same with FLUX.2's empirical mu; Qwen-Image 2.1's own sample_sigmas; LTX-2's shift from the
# video tokens; linspace(1, 0, N+1)[:-1] with the config's static shift
GRID_RULES = ("set-timesteps", "dynamic-shift", "empirical-mu", "sample-sigmas", "video-token-shift",
              "static-shift")


@dataclass(frozen=True)
class Family:
    """One diffusers family: the runtime's model.name and what it can do."""

    name: str  # model.name
    adapter: str  # "module:Class" of its policy, the module under digenrl.models.diffusers_adapters
    catalogue: str  # name prefix of its entries in digenrl.sim.catalogue.MODELS (the size picks one)
    checkpoint: str  # the catalogue entry of the checkpoint its recipe loads
    recipe: str  # its recipe, a file in recipes/
    output: str = "image"  # "video": decode gives (B, F, 3, H, W) and model.frames acts
    audio: bool = False  # samples carry an audio track besides the video (the class has decode_audio)
    conditioning: Optional[str] = None  # one image per prompt conditions it (CONDITIONINGS), data rows carry it
    embedded_guidance: bool = False  # guidance-distilled: the transformer takes the scale as an input
    two_experts: bool = False  # a high- and a low-noise transformer (model.experts picks which train)
    sequence_parallel: bool = False  # Ulysses attention over a gang's GPUs (runtime.*.sp)
    # sampling.sigmas=diffusers: how its pipeline asks the scheduler for the grid (GRID_RULES,
    # diffusers_adapters/sigmas.py; None: no grid of its own) ...
    grid_rule: Optional[str] = None
    # ... and the scheduler/scheduler_config.json of the reference checkpoint (the keys that
    # differ from the class defaults), the fallback when the folder has none; None: the folder's
    # own config is required
    scheduler: Optional[dict[str, Any]] = None
    # conditioned families sample on this family's grid, with its published fallback (the
    # Kontext / Edit / I2V checkpoints' scheduler configs could not be read offline, so a
    # pipeline folder's own config is the one to trust)
    base: Optional[str] = None
    # its diffusers grid starts just below sigma 1, where flow-sde's noise explodes (the config
    # refuses that pair; digenrl.config.rules.flow_sde_near_one gives the figures)
    grid_near_one: bool = False
    # `digenrl profile`: whether the prompt's tokens sit inside the joint attention sequence
    # (None: profiling is not built for it: a conditioned family, or ltx2 whose flat two-stream
    # latent has no (C, F, H, W) geometry), and latent positions per token side (1: latents
    # patchified into channels already, or unpatched)
    joint_text: Optional[bool] = None
    latent_patch: int = 2

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"Family {self.name}: output {self.output!r}; allowed: {OUTPUTS}")
        if self.conditioning not in (None, *CONDITIONINGS):
            raise ValueError(f"Family {self.name}: conditioning {self.conditioning!r}; allowed: {CONDITIONINGS}")
        if self.audio and self.output != "video":
            raise ValueError(f"Family {self.name}: an audio track comes with a video")
        if self.grid_rule not in (None, *GRID_RULES):
            raise ValueError(f"Family {self.name}: grid_rule {self.grid_rule!r}; allowed: {GRID_RULES}")
        if self.scheduler is not None and self.grid_rule is None:
            raise ValueError(f"Family {self.name}: a published scheduler config without a grid_rule")

    @property
    def video(self) -> bool:
        return self.output == "video"

    @property
    def grid(self) -> bool:
        """Whether sampling.sigmas=diffusers builds a grid from a scheduler of its own."""
        return self.grid_rule is not None

    @property
    def module(self) -> str:
        return "digenrl.models.diffusers_adapters." + self.adapter.split(":")[0]

    @property
    def cls(self) -> str:
        return self.adapter.split(":")[1]


_FM = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000}

# Published scheduler configs: stabilityai/stable-diffusion-3.5-medium, black-forest-labs/FLUX.1-dev,
# Wan-AI/Wan2.1-T2V-1.3B-Diffusers (480p: flow_shift 3.0), Qwen/Qwen-Image,
# hunyuanvideo-community/HunyuanVideo.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("flux", "flux:FluxPolicy", "flux.1", "flux.1-12b", "flux_pickscore.yaml",
           embedded_guidance=True, joint_text=True,
           grid_rule="dynamic-shift",
           scheduler={**_FM, "shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
                      "base_image_seq_len": 256, "max_image_seq_len": 4096}),
    Family("sd3", "sd3:SD3Policy", "sd3.5", "sd3.5-medium", "sd35_pickscore.yaml",
           joint_text=True, grid_rule="set-timesteps", scheduler={**_FM, "shift": 3.0}),
    Family("wan", "wan:WanPolicy", "wan2.1", "wan2.1-1.3b", "wan_pickscore.yaml", grid_near_one=True,
           output="video", sequence_parallel=True, joint_text=False,
           grid_rule="set-timesteps",
           scheduler={"_class_name": "UniPCMultistepScheduler", "num_train_timesteps": 1000, "flow_shift": 3.0,
                      "use_flow_sigmas": True, "prediction_type": "flow_prediction", "final_sigmas_type": "zero",
                      "solver_order": 2, "solver_type": "bh2", "predict_x0": True, "lower_order_final": True}),
    Family("qwen-image", "qwen_image:QwenImagePolicy", "qwen-image", "qwen-image-20b", "qwen_image_pickscore.yaml",
           joint_text=True,
           grid_rule="dynamic-shift",
           scheduler={**_FM, "shift": 1.0, "use_dynamic_shifting": True, "time_shift_type": "exponential",
                      "base_shift": 0.5, "max_shift": 0.9, "base_image_seq_len": 256, "max_image_seq_len": 8192,
                      "shift_terminal": 0.02}),
    Family("hunyuan-video", "hunyuan_video:HunyuanVideoPolicy", "hunyuanvideo", "hunyuanvideo-13b",
           "hunyuan_video_pickscore.yaml",
           output="video", embedded_guidance=True, sequence_parallel=True, joint_text=True,
           grid_rule="static-shift", scheduler={**_FM, "shift": 7.0}),
    Family("wan2.2", "wan22:Wan22Policy", "wan2.2", "wan2.2-a14b", "wan22_pickscore.yaml",
           output="video", two_experts=True, joint_text=False),
    Family("flux2-klein", "flux2_klein:Flux2KleinPolicy", "flux.2-klein", "flux.2-klein-9b",
           "flux2_klein_pickscore.yaml", joint_text=True, latent_patch=1),
    Family("z-image", "z_image:ZImagePolicy", "z-image", "z-image-6b", "z_image_pickscore.yaml", joint_text=True),
    Family("flux2", "flux2:Flux2Policy", "flux.2", "flux.2-dev-32b", "flux2_pickscore.yaml",
           embedded_guidance=True, grid_rule="empirical-mu", joint_text=True, latent_patch=1),
    Family("qwen-image-2.1", "qwen_image21:QwenImage21Policy", "qwen-image-2.1", "qwen-image-2.1-7b",
           "qwen_image21_pickscore.yaml", grid_rule="sample-sigmas", joint_text=True, latent_patch=1),
    Family("sana", "sana:SanaPolicy", "sana", "sana-1.6b", "sana_pickscore.yaml",
           grid_rule="set-timesteps", grid_near_one=True, joint_text=False, latent_patch=1),
    Family("sana-video", "sana:SanaVideoPolicy", "sana-video", "sana-video-2b", "sana_video_pickscore.yaml",
           output="video", grid_rule="set-timesteps", grid_near_one=True, joint_text=False),
    Family("hunyuan-video-1.5", "hunyuan_video15:HunyuanVideo15Policy", "hunyuanvideo-1.5", "hunyuanvideo-1.5-8b",
           "hunyuan_video15_pickscore.yaml", output="video", sequence_parallel=True, grid_rule="static-shift",
           joint_text=True),
    # video with an audio track: the trajectory latent holds both streams (ltx2.py)
    Family("ltx2", "ltx2:LTX2Policy", "ltx-2", "ltx-2-19b", "ltx2_pickscore.yaml",
           output="video", audio=True, grid_rule="video-token-shift"),
    Family("cosmos-predict2.5", "cosmos_predict25:CosmosPredict25Policy", "cosmos-predict2.5",
           "cosmos-predict2.5-2b", "cosmos_predict25_pickscore.yaml", output="video", grid_rule="set-timesteps",
           grid_near_one=True, joint_text=False),
    # conditioned: one image per prompt (protocol.encode_inputs)
    Family("flux-kontext", "flux_kontext:FluxKontextPolicy", "flux.1-kontext", "flux.1-kontext-12b",
           "flux_kontext_pickscore.yaml", conditioning="reference-image", embedded_guidance=True, base="flux"),
    Family("qwen-image-edit", "qwen_image_edit:QwenImageEditPolicy", "qwen-image-edit", "qwen-image-edit-20b",
           "qwen_image_edit_pickscore.yaml", conditioning="reference-image", base="qwen-image"),
    Family("wan-i2v", "wan_i2v:WanI2VPolicy", "wan2.1-i2v", "wan2.1-i2v-14b", "wan_i2v_pickscore.yaml",
           output="video", conditioning="first-frame", base="wan"),
    Family("hunyuan-video-1.5-i2v", "hunyuan_video15_i2v:HunyuanVideo15I2VPolicy", "hunyuanvideo-1.5-i2v",
           "hunyuanvideo-1.5-i2v-8b", "hunyuan_video15_i2v_pickscore.yaml",
           output="video", conditioning="first-frame", sequence_parallel=True, base="hunyuan-video-1.5"),
)}
_TRAITS = {f.name for f in fields(Family)} | {"video", "grid"}


def family(name: str) -> Family:
    """The Family of a model.name; a ValueError naming the allowed ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"model family {name!r} unknown; allowed: {', '.join(FAMILIES)}") from None


def names(**traits: Any) -> tuple[str, ...]:
    """The families whose traits equal every given value, in declaration order:
    names(video=True), names(two_experts=True), names(conditioning="first-frame")."""
    unknown = set(traits) - _TRAITS
    if unknown:
        raise TypeError(f"names(): no trait {sorted(unknown)}; traits: {sorted(_TRAITS)}")
    return tuple(n for n, f in FAMILIES.items() if all(getattr(f, k) == v for k, v in traits.items()))


def names_with(trait: str) -> tuple[str, ...]:
    """The families with `trait` set (any value: names_with("conditioning") is every conditioned
    family), in declaration order."""
    return tuple(n for n in FAMILIES if has(n, trait))


def has(name: str, trait: str) -> bool:
    """Whether model.name `name` is a family with `trait` set (False for tiny-dit or an unknown name)."""
    return name in FAMILIES and bool(getattr(FAMILIES[name], trait))


def conditioning_kind(name: str) -> Optional[str]:
    """What conditions model.name `name` (one of CONDITIONINGS), or None: prompts only, tiny-dit,
    or an unknown name."""
    return FAMILIES[name].conditioning if name in FAMILIES else None


def grid_family(name: str) -> Family:
    """The family whose sigma grid `name` samples on: its base if it has one, else itself."""
    f = family(name)
    return FAMILIES[f.base] if f.base else f

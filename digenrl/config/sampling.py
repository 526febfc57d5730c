"""config.sampling: how rollouts denoise (SamplingConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from digenrl.config.errors import ConfigError, check, one_of
from digenrl.math.kinds import MODEL_TIMESTEPS, ROLLOUT_DTYPES, SDE_KINDS
from digenrl.math.window import WINDOW_DRAWS, WINDOW_KINDS, SdeWindow

# sampling.sigmas: digenrl's own shifted grid, or the one the family's diffusers scheduler builds
SIGMA_GRIDS = ("digenrl", "diffusers")


@dataclass
class SamplingConfig:
    """How rollouts denoise: the sigma grid, the SDE, guidance, and which steps are SDE and trained."""

    num_steps: int = 10  # denoising steps per rollout
    eval_num_steps: int = 10  # denoising steps of held-out evaluation (ODE, same noise at every evaluation)
    # digenrl: shift(linspace(1, 0, num_steps + 1)) with `shift`; diffusers: the grid the
    # model family's diffusers pipeline asks its scheduler for (shift from model.path's
    # scheduler config, FLUX / Qwen-Image: dynamic from the resolution). See docs/guides/models.md.
    sigmas: str = "digenrl"
    shift: float = 1.0  # SD3 time shift of the digenrl grid
    # the stochastic step of the SDE window: flow-sde (Flow-GRPO), dance-sde (DanceGRPO), cps
    # (coefficients-preserving) or ode (no noise, no log-probs: train.loss=nft, dpo or awm only); digenrl.math.sde
    sde: str = "flow-sde"
    # the SDE's noise scale: `a` of flow-sde and cps, `eta` of dance-sde (ode draws none)
    noise_level: float = 0.7
    cfg_scale: float = 1.0  # classifier-free guidance scale; 1 = no guidance (no doubled batch)
    # two-expert families (wan2.2): the low-noise expert's CFG scale (diffusers' guidance_scale_2;
    # cfg_scale is then the high-noise expert's, guidance_scale). 0 = cfg_scale for both.
    # Other families refuse it.
    cfg_scale_low: float = 0.0
    # which steps are SDE / trained: see math.schedule.SdeWindow. The default trains the first
    # window_size steps (ODE after): on the toy world it learns several times faster per
    # second than all-but-last (docs/measurements/default-run.md); the real-model recipes name theirs
    window: str = "first"
    window_size: int = 2  # first, contiguous, sliding: how many denoising steps the window holds
    window_stride: int = 1  # sliding: how many steps the window moves each time it moves
    window_every: int = 10  # sliding: the window moves every this many RL steps (wrapping)
    window_fraction: float = 0.6  # fraction: the share of SDE steps trained, drawn at random, in (0, 1]
    # step: one set of trained steps per RL step, shared by its samples; sample: each sample
    # draws its own (DanceGRPO's per-sample fraction; DiffusionNFT's per-sample noise levels).
    # See rollout.sampler.trained_steps.
    window_draw: str = "step"
    # "" = rollouts compute in model.dtype like the trainer; bfloat16 = the rollout's denoiser
    # forwards run under bf16 autocast while the trainer scores in model.dtype (float32): a
    # rollout engine at lower precision, to measure the rollout-train log-prob gap
    # (consistency/* metrics) and test its corrections on any machine
    rollout_dtype: str = ""
    # -- DanceGRPO's model timestep --
    # exact: the model is conditioned on sigma; floor: on int(sigma * 1000) / 1000, as DanceGRPO
    # conditions its transformer, while every SDE step, log-prob and forward-process target
    # keeps the exact sigma (rollout.sampler.SampleSpec.model_sigma)
    model_timestep: str = "exact"

    def __post_init__(self) -> None:
        one_of(self.model_timestep, "sampling.model_timestep", MODEL_TIMESTEPS)
        check(self.num_steps >= 2, "sampling.num_steps", f"must be >= 2, got {self.num_steps}")
        one_of(self.rollout_dtype, "sampling.rollout_dtype", ROLLOUT_DTYPES)
        check(self.eval_num_steps >= 1, "sampling.eval_num_steps", "must be >= 1")
        check(self.shift > 0, "sampling.shift", "must be > 0")
        one_of(self.sigmas, "sampling.sigmas", SIGMA_GRIDS)
        check(self.sigmas == "digenrl" or self.shift == 1.0, "sampling.shift",
              "shifts the digenrl grid only; sampling.sigmas=diffusers takes its shift from the pipeline's "
              "scheduler config (model.path/scheduler/scheduler_config.json): leave sampling.shift at 1.0")
        one_of(self.sde, "sampling.sde", SDE_KINDS)
        check(self.noise_level > 0, "sampling.noise_level", "must be > 0")
        check(self.sde != "ode" or self.noise_level == 0.7, "sampling.noise_level",
              "sampling.sde=ode draws no noise: leave sampling.noise_level at its default 0.7")
        one_of(self.window_draw, "sampling.window_draw", WINDOW_DRAWS)
        check(self.cfg_scale >= 1.0, "sampling.cfg_scale", "must be >= 1 (1 = no guidance)")
        check(self.cfg_scale_low == 0 or self.cfg_scale_low >= 1.0, "sampling.cfg_scale_low",
              f"must be >= 1 (1 = no guidance in the low-noise expert), or 0 (= sampling.cfg_scale), "
              f"got {self.cfg_scale_low}")
        one_of(self.window, "sampling.window", WINDOW_KINDS)
        try:
            self.sde_window().validate(self.num_steps)
        except ValueError as e:
            raise ConfigError(f"sampling.window_size: {e}") from None

    @property
    def guided(self) -> bool:
        """Whether any step runs classifier-free guidance (a doubled batch)."""
        return self.cfg_scale != 1.0 or self.cfg_scale_low not in (0.0, 1.0)

    def sde_window(self) -> SdeWindow:
        try:
            return SdeWindow(
                self.window, self.window_size, self.window_stride, self.window_every, self.window_fraction
            )
        except ValueError as e:
            raise ConfigError(f"sampling.window: {e}") from None


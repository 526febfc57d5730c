"""Wan2.2 A14B text-to-video: two WanTransformer3DModel experts split by noise level.

Conventions, with line numbers in diffusers@v0.42.1 src/diffusers/pipelines/wan/pipeline_wan.py;
everything per expert is Wan2.1's (wan.py: timestep sigma * 1000, output eps - x0, UMT5 text,
decode):
- experts: `boundary_timestep = boundary_ratio * num_train_timesteps` (586), then
  `transformer` (high noise) runs where `t >= boundary_timestep`, `transformer_2` (low
  noise) below (597-604). With t = sigma * 1000 that is sigma >= boundary_ratio. The
  pipeline switches per step; our batches may mix steps (a learner micro-batch drawing
  each row's own step), so `TwoExperts` routes per row and puts rows back in order.
- guidance: the pipeline takes `guidance_scale` for the high expert and `guidance_scale_2`
  for the low one (517-521, 600/604; default: the same), CFG on when guidance_scale > 1
  (364). Ours: `sampling.cfg_scale` and `sampling.cfg_scale_low` (0 = the same), which
  `guided_velocity` applies per row by `low_noise_rows`, the routing rule below.
- `boundary_ratio` lives in the pipeline's model_index.json (152); the TI2V-5B layout
  (`expand_timesteps`, one transformer, per-token timesteps: 607-611) is refused.

`policy.module` stays one nn.Module (`TwoExperts`: `.high`, `.low`) so the learner,
weight sync, EMA and checkpoints see one parameter tree ("high.blocks.0...", "low...").
`experts` (model.experts) picks what trains: both, or one with the other frozen (no
LoRA, requires_grad False). FSDP is not built for it (ranks would run different experts
on their own rows and their collectives would not pair up): digenrl.config.schema refuses
wan2.2 with runtime.trainer.shard=fsdp, and sequence parallelism (wan only).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from digenrl.models.diffusers_adapters.wan import WanPolicy

NUM_TRAIN_TIMESTEPS = 1000  # Wan's scheduler config; the pipeline's boundary is boundary_ratio * this


class TwoExperts(torch.nn.Module):
    """Wan2.2's high- and low-noise transformers behind one forward.

    forward takes WanTransformer3DModel's arguments; each row goes to `high` where its
    timestep >= boundary_ratio * 1000, else to `low`. `config` is the high expert's (both
    experts share the architecture; the adapter reads patch size and channels from it).
    """

    def __init__(self, high: torch.nn.Module, low: torch.nn.Module, boundary_ratio: float):
        super().__init__()
        if not 0.0 < boundary_ratio < 1.0:
            raise ValueError(f"wan2.2: boundary_ratio must be in (0, 1), got {boundary_ratio}")
        self.high = high
        self.low = low
        self.boundary_ratio = float(boundary_ratio)
        # cast_module keeps these submodules (rope, time embedder, norms) in float32, by name
        self._keep_in_fp32_modules = list(getattr(high, "_keep_in_fp32_modules", None) or [])

    @property
    def config(self) -> Any:
        return self.high.config

    @property
    def gradient_checkpointing(self) -> bool:
        return self.high.gradient_checkpointing and self.low.gradient_checkpointing

    def enable_gradient_checkpointing(self) -> None:
        self.high.enable_gradient_checkpointing()
        self.low.enable_gradient_checkpointing()

    def is_high(self, timestep: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the rows the high-noise expert takes (pipeline_wan.py:597)."""
        return timestep >= self.boundary_ratio * NUM_TRAIN_TIMESTEPS

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                return_dict: bool = False, **kwargs: Any) -> tuple[torch.Tensor]:
        if return_dict:
            raise ValueError("TwoExperts returns a tuple only (return_dict=False)")
        high = self.is_high(timestep)  # (B,)

        def run(expert, rows):
            return expert(hidden_states=hidden_states[rows], timestep=timestep[rows],
                          encoder_hidden_states=encoder_hidden_states[rows], return_dict=False, **kwargs)[0]

        if bool(high.all()):  # the usual case (every rollout step): one expert, the whole batch
            return (run(self.high, slice(None)),)
        if not bool(high.any()):
            return (run(self.low, slice(None)),)
        rows_high, rows_low = high.nonzero().squeeze(1), (~high).nonzero().squeeze(1)
        out = torch.cat([run(self.high, rows_high), run(self.low, rows_low)])  # rows in (high, low) order
        order = torch.argsort(torch.cat([rows_high, rows_low]))  # back to the batch's order
        return (out[order],)


class Wan22Policy(WanPolicy):
    family = "wan2.2"

    def __init__(
        self,
        transformer: torch.nn.Module,
        vae: Optional[torch.nn.Module] = None,
        text_modules: Optional[dict[str, Any]] = None,
        *,
        transformer_2: Optional[torch.nn.Module] = None,
        boundary_ratio: Optional[float] = None,
        **options: Any,
    ):
        """transformer: the high-noise expert, or a ready `TwoExperts` (then no transformer_2 /
        boundary_ratio); transformer_2: the low-noise expert; boundary_ratio: the pipeline's."""
        if not isinstance(transformer, TwoExperts):
            if transformer_2 is None or boundary_ratio is None:
                raise ValueError("wan2.2 needs both experts and the pipeline's boundary_ratio (transformer_2 "
                                 "and boundary_ratio); a single-transformer Wan is model.name=wan")
            transformer = TwoExperts(transformer, transformer_2, boundary_ratio)
        super().__init__(transformer, vae, text_modules, **options)

    @classmethod
    def _from_pipeline(cls, pipe: Any, text_modules: Optional[dict[str, Any]],
                       condition_modules: Optional[dict[str, Any]], options: dict[str, Any]):
        cfg = pipe.config  # (no conditioning components: the T2V layout)
        if cfg.get("expand_timesteps", False):
            raise ValueError("wan2.2: this pipeline has expand_timesteps (the TI2V-5B layout: one transformer, "
                             "per-token timesteps), which is not supported; wan2.2 is the A14B two-expert layout")
        if getattr(pipe, "transformer_2", None) is None or cfg.get("boundary_ratio") is None:
            raise ValueError("wan2.2: the pipeline has no transformer_2 / boundary_ratio (a single-transformer "
                             "Wan); load it as model.name=wan")
        return cls(pipe.transformer, pipe.vae, text_modules=text_modules, transformer_2=pipe.transformer_2,
                   boundary_ratio=cfg["boundary_ratio"], **options)

    def low_noise_rows(self, sigma: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the rows the low-noise expert serves at sigma (B,), by `TwoExperts`'
        own rule on the timestep `_forward` gives it (sigma * 1000), so guidance
        (`protocol.guided_velocity`, sampling.cfg_scale_low) and routing always agree."""
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=self.device)
        return ~self.module.is_high(sigma * 1000.0)

    def trained_module(self) -> torch.nn.Module:
        return {"both": self.module, "high": self.module.high, "low": self.module.low}[self.options.experts]

"""LoRA through peft for any torch module (our tiny DiT and diffusers transformers alike)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

ADAPTER = "default"


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 8
    alpha: float = 16.0
    target_modules: tuple[str, ...] = field(default_factory=tuple)  # names or suffixes of nn.Linear
    dropout: float = 0.0  # must stay 0 for RL: dropout breaks ratio == 1 on-policy
    init_seed: int = 0  # lora_A's random init: the same in every process (trainers all-reduce one model)

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1, got {self.rank}")
        if not self.target_modules:
            raise ValueError("lora target_modules must name at least one module")
        if self.dropout != 0.0:
            raise ValueError("lora dropout must be 0: random dropout would make logp != logp_old on-policy")


def apply_lora(module: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """Inject LoRA adapters in place; afterwards only adapter parameters require grad."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=0.0,
        init_lora_weights=True,  # B = 0: the adapted model starts equal to the base
    )
    inject_adapter_in_model(config, module, adapter_name=ADAPTER)
    _seed_lora_a(module, spec.init_seed)
    for name, p in module.named_parameters():
        p.requires_grad_("lora_" in name)
    return module


@torch.no_grad()
def _seed_lora_a(module: torch.nn.Module, seed: int) -> None:
    """Redraw every lora_A from one seeded CPU generator, with peft's distribution.

    peft draws lora_A from the global RNG, whose state differs between the local trainer,
    rollout workers and each trainer process; data-parallel trainers that sum gradients
    must hold the same weights. Kaiming-uniform with a=sqrt(5) is U(-1/sqrt(fan_in), +).
    """
    params = dict(module.named_parameters())
    for name, value in lora_a_draws({n: p.shape for n, p in params.items()}, seed):
        params[name].copy_(value.to(params[name].dtype))


def lora_a_draws(shapes: dict[str, torch.Size], seed: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, float32 value) of every lora_A among `shapes` (parameter name -> global shape),
    in the order `_seed_lora_a` draws them: a sharded loader draws the same values on every
    rank and keeps its own rows (digenrl/runtime/sharded_load.py)."""
    gen = torch.Generator().manual_seed(seed)
    for name, shape in sorted(shapes.items()):
        if "lora_A" in name:
            bound = 1.0 / torch.Size(shape[1:]).numel() ** 0.5  # fan_in
            yield name, (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).mul_(bound)


def has_lora(module: torch.nn.Module) -> bool:
    return any("lora_" in name for name, _ in module.named_parameters())


@contextlib.contextmanager
def adapters_disabled(module: torch.nn.Module) -> Iterator[None]:
    """Run the base model (the KL reference policy) without copying its weights."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
            # enable_adapters(True) re-enables grad on adapter weights; keep base frozen.
        for name, p in module.named_parameters():
            p.requires_grad_("lora_" in name)


def trainable_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What RL changes and weight sync must move: adapters only under LoRA, else everything."""
    params = dict(module.named_parameters())
    if has_lora(module):
        return {k: v.detach() for k, v in params.items() if "lora_" in k}
    return {k: v.detach() for k, v in module.state_dict().items()}


def load_trainable_state_dict(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what `trainable_state_dict` produced (in place, keeps parameters' identity)."""
    own = module.state_dict()
    unknown = set(state) - set(own)
    if unknown:
        raise KeyError(f"state names {len(unknown)} unknown tensors, e.g. {sorted(unknown)[:3]}")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)

"""Typed run configuration: dataclasses validated at construction, from YAML and key=value.

    cfg = load_config("recipes/toy_fast.yaml", ["train.steps=20", "data.group_size=8"])

Unknown keys and bad values fail before any work starts, naming the key and what is
allowed. `Config` is the root: its sections (model.py ... runtime.py) check their own keys,
then it checks the rules across sections (rules.py).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from digenrl.config import rules
from digenrl.config.build import build
from digenrl.config.data import DataConfig
from digenrl.config.errors import ConfigError, check
from digenrl.config.model import ModelConfig
from digenrl.config.reward import RewardConfig
from digenrl.config.run import RunConfig
from digenrl.config.runtime import RuntimeConfig
from digenrl.config.sampling import SamplingConfig
from digenrl.config.train import TrainConfig


@dataclass
class Config:
    """The run: one section per concern, each checked on its own, then the rules across them."""

    model: ModelConfig = field(default_factory=ModelConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        # the rules across sections (rules.py), in this order: the first broken one is reported
        for rule in (rules.weights_given, rules.adv_std_streams, rules.rollout_dtype, rules.lora_only_sync,
                     rules.dpo_whole_groups, rules.gdpo_whole_groups, rules.ray_only,
                     rules.micro_batch_samples_streams, rules.sharded_trainer, rules.sequence_parallel,
                     rules.rollout_workers, rules.tag_offload, rules.colocated_spot, rules.cuda_pools,
                     rules.sigma_grid, rules.cfg_scale_low, rules.flow_sde_near_one, rules.ode_clean_losses,
                     rules.gaussian_step_losses, rules.window_draw, rules.conditioned_rows, rules.reward_inputs,
                     rules.nft_sharded_reshard, rules.toy_geneval_prompts):
            rule(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def given(self) -> Optional[frozenset]:
        """Dotted keys the YAML file or overrides set (e.g. 'runtime.rollout.workers'); None
        for a Config built in code (all of it is taken as given). runtime.plan leaves these
        as they are."""
        return getattr(self, "_given", None)

    def wants_plan(self) -> bool:
        """Does this run plan its knobs on the cluster at hand (runtime.plan)? auto: when the
        config file and overrides give no pool size; always: every knob they do not give."""
        rt = self.runtime
        if self.run.mode == "local" or rt.compute != "real" or rt.plan == "never":
            return False
        pools = {"runtime.rollout.workers", "runtime.trainer.workers"}
        return rt.plan == "always" or (self.given is not None and not pools & self.given)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        check(isinstance(node, dict), dotted, "cannot set a key inside a non-mapping value")
    node[parts[-1]] = value


def with_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """A copy of `cfg` with dotted-key overrides (typed values, e.g. {"train.lr": 3e-4})
    applied and validated as load_config validates."""
    tree = cfg.to_dict()
    for key, value in overrides.items():
        _set_dotted(tree, key, value)
    return load_config(None, tree=tree)


def dotted_get(tree: dict, key: str) -> Any:
    """tree["runtime"]["rollout"]["workers"] for key "runtime.rollout.workers"."""
    for part in key.split("."):
        tree = tree[part]
    return tree


def load_config(path: Optional[str | Path] = None, overrides: Optional[list[str]] = None, *,
                tree: Optional[dict] = None) -> Config:
    """Defaults <- YAML file (or `tree`, the same mapping in memory) <- key=value overrides
    (values parsed as YAML scalars)."""
    tree = copy.deepcopy(tree) if tree else {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"--config: no such file {str(p)!r}")
        tree = yaml.safe_load(p.read_text()) or {}
        check(isinstance(tree, dict), str(p), "a config file must be a mapping of sections")
    for item in overrides or []:
        check("=" in item, item, "overrides are key=value, e.g. train.steps=20")
        key, raw = item.split("=", 1)
        _set_dotted(tree, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
    cfg = build(Config, tree, "")
    cfg._given = frozenset(_dotted_keys(tree))
    return cfg


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, dict):
            out += _dotted_keys(v, key + ".")
    return out


def dump_config(cfg: Config, only_changed: bool = True) -> str:
    """`cfg` as YAML that load_config reads back to an equal Config; only_changed: only the
    keys that differ from the defaults (what `digenrl plan` writes)."""
    tree = cfg.to_dict()
    if only_changed:
        tree = _diff(tree, Config().to_dict())
    return yaml.safe_dump(tree, sort_keys=False)


def _diff(tree: dict, default: dict) -> dict:
    out = {}
    for k, v in tree.items():
        d = default.get(k)
        if isinstance(v, dict) and isinstance(d, dict) and k not in ("weights", "paths", "resources"):
            sub = _diff(v, d)
            if sub:
                out[k] = sub
        elif v != d:
            out[k] = v
    return out

"""Reward specs: the strings that name a reward. `digenrl reward-server SPEC` takes
one; `registry_models` builds one from a `reward.paths` entry.

    pickscore?path=/models/PickScore_v1&device=cuda      an alias from ALIASES, with kwargs
    my_pkg.rewards:MyReward?scale=2                      any importable factory
"""

from __future__ import annotations

import importlib
import json
from urllib.parse import parse_qsl

from digenrl.rewards.base import Reward

ALIASES = {
    "clip-score": "digenrl.rewards.clip_models:ClipScore",
    "pickscore": "digenrl.rewards.clip_models:PickScore",
    "aesthetic": "digenrl.rewards.clip_models:AestheticScore",
    "hpsv2": "digenrl.rewards.clip_models:HPSv2Score",
    "ocr": "digenrl.rewards.clip_models:OCRScore",
    "hpsv3": "digenrl.rewards.preference_models:HPSv3Score",
    "imagereward": "digenrl.rewards.preference_models:ImageRewardScore",
    "vlm-judge": "digenrl.rewards.vlm_judge:VLMJudge",
    "geneval-detector": "digenrl.rewards.detector:GenEvalDetector",
    "clap": "digenrl.rewards.clap:ClapScore",
    "xclip": "digenrl.rewards.xclip:XClipScore",
}


def parse_kwargs(query: str) -> dict:
    """`key=value&key=value` -> kwargs; values parse as JSON when they can (numbers, true, null),
    else stay strings. Percent-escapes are decoded (`%26` is a literal `&`, `+` a space)."""
    kwargs = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def resolve_factory(target: str):
    """The callable a spec target names: an ALIASES key or `module.path:Factory`."""
    target = ALIASES.get(target, target)
    if ":" not in target:
        raise ValueError(f"unknown reward {target!r}: use one of {sorted(ALIASES)} or 'module.path:Factory'")
    module, attr = target.split(":", 1)
    return getattr(importlib.import_module(module), attr)


def resolve_reward(spec: str | Reward) -> Reward:
    """A Reward from a spec: `NAME` or `module.path:Factory`, with `?key=value&key=value` kwargs.

    NAME is one of ALIASES; values are parsed as JSON when they parse (numbers, true, null),
    else kept as strings. Example: `pickscore?path=/models/PickScore_v1&processor_path=/models/clip-h&device=cuda`.
    A Reward instance passes through.
    """
    if not isinstance(spec, str):
        reward = spec
    else:
        target, _, query = spec.partition("?")
        reward = resolve_factory(target)(**parse_kwargs(query))
    if not callable(reward) or not isinstance(getattr(reward, "name", None), str):
        raise TypeError(f"{spec!r} did not give a Reward (a callable with a str `name`)")
    return reward

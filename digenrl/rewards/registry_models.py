"""Model rewards by config name: `reward.paths.<name>` says where the model is.

    reward.paths.pickscore=/models/PickScore_v1                     a local folder
    reward.paths.pickscore="path=/models/PickScore_v1&processor_path=/models/clip-h"
    reward.paths.aesthetic="clip_path=/models/clip-l&head_path=/models/aesthetic.safetensors"
    reward.paths.hpsv2=/models/HPS_v2.1_compressed.pt
    reward.paths.hpsv3=/models/HPSv3.safetensors                    needs digenrl[hpsv3]
    reward.paths.imagereward=/models/ImageReward/ImageReward.pt     needs digenrl[imagereward]
    reward.paths.geneval-detector="path=/models/owlv2&metadata=/data/geneval_metadata.jsonl"
    reward.paths.clap=/models/larger_clap_general                   scores the audio track (ltx2)
    reward.paths.xclip=/models/xclip-base-patch32                   scores videos
    reward.paths.remote=http://10.0.0.5:8000#pickscore               served by `digenrl reward-server`
    reward.paths.vlm-judge="url=http://10.0.0.5:8000&model=Qwen/Qwen2.5-VL-7B-Instruct&style=yes-no"

A bare path is the model's first argument; a `key=value&...` string passes keyword
arguments (as the reward server's specs do). Nothing is downloaded.
"""

from __future__ import annotations

import inspect
from urllib.parse import quote

from digenrl.rewards.specs import parse_kwargs, resolve_factory, resolve_reward

_FIRST_ARGUMENT = {
    "pickscore": "path",
    "clip-score": "path",
    "hpsv2": "checkpoint_path",
    "hpsv3": "checkpoint_path",
    "imagereward": "checkpoint_path",
    "geneval-detector": "path",
    "clap": "path",
    "xclip": "path",
}
_NO_DEVICE = ("ocr", "vlm-judge")  # OCR picks its own; a judge's device is its server's


def build(name: str, where: str, device: str = "cpu"):
    if name == "remote":
        from digenrl.rewards.client import RemoteReward

        url, _, served = where.partition("#")
        if not served:
            raise ValueError(f"reward.paths.remote={where!r}: add '#<served reward name>', e.g. http://host:8000#pickscore")
        return RemoteReward(url, served)
    if "=" in where:
        query = where
    elif name in _FIRST_ARGUMENT:
        query = f"{_FIRST_ARGUMENT[name]}={quote(where)}"
    elif name == "vlm-judge":
        raise ValueError(f"reward.paths.vlm-judge: give key=value arguments, e.g. {_JUDGE_EXAMPLE}")
    else:
        raise ValueError(f"reward.paths.{name}: give key=value arguments, e.g. clip_path=...&head_path=...")
    if name not in _NO_DEVICE and "device=" not in query:
        query += f"&device={device}"
    return resolve_reward(f"{name}?{query}")


_JUDGE_EXAMPLE = "url=http://host:8000&model=Qwen/Qwen2.5-VL-7B-Instruct&style=yes-no"


def check_args(name: str, where: str) -> None:
    """Raise ValueError if `reward.paths.<name>=where` passes keys the reward does not take
    (or, for vlm-judge, values it refuses), without loading a model or contacting a server."""
    if name == "remote":
        return
    if "=" not in where:
        if name == "vlm-judge":
            raise ValueError(f"give key=value arguments, e.g. {_JUDGE_EXAMPLE}")
        return  # a bare location; the preflight checks it exists
    factory = resolve_factory(name)
    kwargs = parse_kwargs(where)
    if name == "vlm-judge":
        from digenrl.rewards.vlm_judge import JudgeConfig

        JudgeConfig.from_kwargs(**kwargs)
        return
    params = inspect.signature(factory).parameters
    takes = [p for p in params if params[p].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)]  # fmt: skip
    unknown = sorted(set(kwargs) - set(takes))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; {name} takes: {', '.join(takes)}")

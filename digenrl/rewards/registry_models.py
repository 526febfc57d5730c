"""Model rewards by config name: `reward.paths.<name>` says where the model is.

    reward.paths.pickscore=/models/PickScore_v1                     a local folder
    reward.paths.pickscore="path=/models/PickScore_v1&processor_path=/models/clip-h"
    reward.paths.aesthetic="clip_path=/models/clip-l&head_path=/models/aesthetic.safetensors"
    reward.paths.hpsv2=/models/HPS_v2.1_compressed.pt
    reward.paths.geneval-detector="path=/models/owlv2&metadata=/data/geneval_metadata.jsonl"
    reward.paths.remote=http://10.0.0.5:8000#pickscore               served by `digenrl reward-server`

A bare path is the model's first argument; a `key=value&...` string passes keyword
arguments (as the reward server's specs do). Nothing is downloaded.
"""

from __future__ import annotations

from urllib.parse import quote

from digenrl.rewards.specs import resolve_reward

_FIRST_ARGUMENT = {"pickscore": "path", "clip-score": "path", "hpsv2": "checkpoint_path", "geneval-detector": "path"}


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
    else:
        raise ValueError(f"reward.paths.{name}: give key=value arguments, e.g. clip_path=...&head_path=...")
    if name != "ocr" and "device=" not in query:
        query += f"&device={device}"
    return resolve_reward(f"{name}?{query}")

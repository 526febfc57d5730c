"""Helpers for tests of rewards served by Ray Serve, whose rewards run in other processes
(ordered with tests/helpers/gates.py's FileGate).

Rewards a replica builds from a spec: `GatedJpeg` (held at a gate), `counted_non_reward` (a
factory that fails the replica's constructor and counts how often it was tried).
"""

from __future__ import annotations

from pathlib import Path

import torch

from digenrl.rewards.toy import JpegCompressibility
from tests.helpers.gates import FileGate


class GatedJpeg(JpegCompressibility):
    """JpegCompressibility whose calls with a prompt 'hold-NAME' first pass FileGate(gate_dir/hold-NAME).

    A spec the CLI builds in its replicas: `tests.serving.helpers:GatedJpeg?gate_dir=/some/dir`.
    """

    def __init__(self, gate_dir: str):
        self.gate_dir = gate_dir

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        for prompt in dict.fromkeys(p for p in prompts if p.startswith("hold-")):
            FileGate(Path(self.gate_dir, prompt)).pass_through()
        return super().__call__(images, prompts)


def counted_non_reward(log: str) -> dict:
    """A reward factory that gives no Reward (the replica's constructor fails), logging each call to `log`."""
    with open(log, "a") as f:
        f.write("called\n")
    return {}

"""Policies behind one protocol: the tiny DiT of the toy world, and diffusers adapters.

`build_policy` and `sampling_sigmas` (models/build.py) and the protocol's names load on first use
(PEP 562): the configuration reads the families' traits from `diffusers_adapters` without torch.
"""

from __future__ import annotations

import importlib

_WHERE = {"build_policy": "build", "empty_loadable": "build", "sampling_sigmas": "build",
          "Cond": "protocol", "Policy": "protocol", "guided_velocity": "protocol"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:  # a submodule (`from digenrl.models import tiny_dit_weights`): the import system loads it
        raise AttributeError(f"module 'digenrl.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"digenrl.models.{where}"), name)
    globals()[name] = value
    return value

"""Policies behind one protocol: the tiny DiT of the toy world, and diffusers adapters.

`build_policy` and `sampling_sigmas` (models/build.py) and the protocol's names load on first use
(PEP 562): the configuration reads the families' traits from `diffusers_adapters` without torch.
"""

from __future__ import annotations

from digenrl.math.lazy import lazy_names

_WHERE = {"build_policy": "build", "empty_loadable": "build", "sampling_sigmas": "build",
          "Cond": "protocol", "Policy": "protocol", "guided_velocity": "protocol"}

__all__ = sorted(_WHERE)
__getattr__ = lazy_names(__name__, _WHERE)

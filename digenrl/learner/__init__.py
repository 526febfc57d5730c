"""Single-device learner: GRPO loss and gradients on training units, optimizer step.

The classes load on first use (PEP 562): the simulator counts passes (learner/passes.py)
without torch.
"""

from __future__ import annotations

import importlib

_WHERE = {"EMA": "ema", "Learner": "learner", "LearnerConfig": "learner", "OldPolicy": "old_policy"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:  # a submodule (`from digenrl.learner import learner`): the import system loads it
        raise AttributeError(f"module 'digenrl.learner' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"digenrl.learner.{where}"), name)
    globals()[name] = value
    return value

"""Single-device learner: GRPO loss and gradients on training units, optimizer step.

The classes load on first use (PEP 562): the simulator counts passes (learner/passes.py)
without torch.
"""

from __future__ import annotations

from digenrl.math.lazy import lazy_names

_WHERE = {"EMA": "ema", "Learner": "learner", "LearnerConfig": "learner", "OldPolicy": "old_policy"}

__all__ = sorted(_WHERE)
__getattr__ = lazy_names(__name__, _WHERE)

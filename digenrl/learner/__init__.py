"""Single-device learner: GRPO loss and gradients on training units, optimizer step."""

from digenrl.learner.ema import EMA
from digenrl.learner.learner import Learner, LearnerConfig
from digenrl.learner.old_policy import OldPolicy

__all__ = ["EMA", "Learner", "LearnerConfig", "OldPolicy"]

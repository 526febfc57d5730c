"""Single-device rollout: sampling trajectory segments with behaviour log-probs."""

from digenrl.rollout.sampler import SampleSpec, Trajectories, advance, finish, generate, start

__all__ = ["SampleSpec", "Trajectories", "advance", "finish", "generate", "start"]

"""Single-device rollout: sampling trajectory segments with behaviour log-probs."""

from digenrl.rollout.sampler import (SampleSpec, Trajectories, advance, audio_kwargs, denoise_step, finish, generate,
                                     start)

__all__ = ["SampleSpec", "Trajectories", "advance", "audio_kwargs", "denoise_step", "finish", "generate", "start"]

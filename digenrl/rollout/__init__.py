"""Single-device rollout: sampling trajectory segments with behaviour log-probs."""

from digenrl.rollout.sampler import (SampleSpec, Trajectories, advance, audio_kwargs, denoise_step, expand, finish,
                                     generate, payload_bytes, ship, start)

__all__ = ["SampleSpec", "Trajectories", "advance", "audio_kwargs", "denoise_step", "expand", "finish", "generate",
           "payload_bytes", "ship", "start"]

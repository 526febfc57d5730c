"""Single-device rollout: sampling trajectory segments with behaviour log-probs."""

from digenrl.rollout.sampler import (SampleSpec, Trajectories, advance, assemble, audio_kwargs, denoise_step, expand,
                                     finish, generate, media_of, payload_bytes, received_bytes, row_kept, ship,
                                     ship_rows, start)

__all__ = ["SampleSpec", "Trajectories", "advance", "assemble", "audio_kwargs", "denoise_step", "expand", "finish",
           "generate", "media_of", "payload_bytes", "received_bytes", "row_kept", "ship", "ship_rows", "start"]

"""Moved to `digenrl.math.rng` (math imports only torch, the standard library and itself);
this name stays so imports written against it keep working."""

from digenrl.math.rng import (  # noqa: F401
    EVAL,
    INIT_NOISE,
    PROMPT,
    SDE_NOISE,
    TRAIN_DATA,
    WINDOW,
    generator,
    key,
    normal,
    per_sample_normal,
    permutation,
    randint,
)

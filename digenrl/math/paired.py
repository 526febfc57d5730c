"""Paired comparison of two policies scored on the same prompts and the same noise.

With per-sample scores base_i and trained_i (i = 1..n, sample i of both drawn from one
noise tensor), the differences d_i = trained_i - base_i carry the effect without the
between-sample spread:

    mean_diff = (1/n) sum d_i
    sd        = sqrt( sum (d_i - mean_diff)^2 / (n - 1) )      (unbiased)
    se        = sd / sqrt(n)
    t         = mean_diff / se                                 (paired t, n - 1 dof)

se and t are None where undefined: n < 2, or t when every d_i is equal (se = 0).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence


def paired_stats(base: Sequence[float], trained: Sequence[float]) -> dict[str, Optional[float]]:
    """{n, base_mean, trained_mean, mean_diff, se, t} of trained - base, paired by index."""
    if len(base) != len(trained):
        raise ValueError(f"paired scores need equal lengths, got {len(base)} base and {len(trained)} trained")
    n = len(base)
    if n == 0:
        raise ValueError("paired scores need at least one sample")
    diffs = [float(t) - float(b) for b, t in zip(base, trained)]
    mean_diff = sum(diffs) / n
    se: Optional[float] = None
    t: Optional[float] = None
    if n >= 2:
        var = sum((d - mean_diff) ** 2 for d in diffs) / (n - 1)
        se = math.sqrt(var / n)
        t = mean_diff / se if se > 0 else None
    return {
        "n": n,
        "base_mean": sum(map(float, base)) / n,
        "trained_mean": sum(map(float, trained)) / n,
        "mean_diff": mean_diff,
        "se": se,
        "t": t,
    }

"""Which denoising steps are stochastic and trained (the SDE window), without torch: the
configuration checks a window and the simulator reads its trained steps; only the random kinds
(contiguous, fraction) draw from `digenrl.math.rng`, which needs torch."""

from __future__ import annotations

import functools

from dataclasses import dataclass

from digenrl.math.kinds import WINDOW_DRAWS, WINDOW_KINDS  # noqa: F401 (WINDOW_DRAWS: re-exported)


@dataclass(frozen=True)
class SdeWindow:
    """Which denoising steps sample with the SDE (the rest use ODE) and which are trained.

    kind:
      all-but-last  Flow-GRPO: SDE on every step but the last; all of those trained.
      first         SDE on the first `size` steps, all of them trained, ODE after: the
                    high-noise steps where layout, colour and count are decided, so the
                    reward's spread within a group comes from the trained steps' noise.
      contiguous    Flow-GRPO-Fast: a random window of `size` steps per RL step; ODE elsewhere.
      sliding       MixGRPO: a window of `size` steps that moves `stride` steps later every
                    `every` RL steps (wrapping), ODE elsewhere.
      fraction      DanceGRPO: SDE on every step but the last, a random `fraction` trained.
    """

    kind: str = "all-but-last"
    size: int = 2
    stride: int = 1
    every: int = 10
    fraction: float = 0.6

    def __post_init__(self) -> None:
        if self.kind not in WINDOW_KINDS:
            raise ValueError(f"sde window kind {self.kind!r} unknown; allowed: {', '.join(WINDOW_KINDS)}")
        if self.size < 1 or self.stride < 1 or self.every < 1:
            raise ValueError("sde window size, stride and every must be >= 1")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"sde window fraction must be in (0, 1], got {self.fraction}")

    def validate(self, num_steps: int) -> None:
        """Raise before any work starts if this window cannot fit `num_steps` steps."""
        usable = num_steps - 1  # the last step goes to sigma=0 and stays ODE
        if usable < 1:
            raise ValueError(f"need at least 2 denoising steps for any SDE window, got {num_steps}")
        if self.kind in ("first", "contiguous", "sliding") and self.size > usable:
            raise ValueError(
                f"sde window size={self.size} is longer than the {usable} usable steps of a "
                f"{num_steps}-step schedule (the last step is always ODE)"
            )

    def select(self, num_steps: int, seed: int, step: int) -> tuple[list[int], list[int]]:
        """(sde_steps, trained_steps) for RL step `step`: sorted denoising-step indices.

        A pure function of (seed, step): every worker computes the same window. Remembered
        (_select): the simulator asks for the same windows in every run it plans.
        """
        sde, trained = _select(self, num_steps, seed, step)
        return list(sde), list(trained)


@functools.lru_cache(maxsize=4096)
def _select(window: SdeWindow, num_steps: int, seed: int, step: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """SdeWindow.select's windows, as tuples (a cached value must not be mutated)."""
    window.validate(num_steps)
    usable = num_steps - 1
    if window.kind == "all-but-last":
        steps = list(range(usable))
        return tuple(steps), tuple(steps)
    if window.kind == "first":
        steps = list(range(window.size))
        return tuple(steps), tuple(steps)
    if window.kind == "contiguous":
        from digenrl.math import rng  # torch: only the random kinds draw

        start = rng.randint(usable - window.size + 1, seed, rng.WINDOW, step)
        steps = list(range(start, start + window.size))
        return tuple(steps), tuple(steps)
    if window.kind == "sliding":
        positions = usable - window.size + 1
        start = ((step // window.every) * window.stride) % positions
        steps = list(range(start, start + window.size))
        return tuple(steps), tuple(steps)
    from digenrl.math import rng  # torch: only the random kinds draw

    sde = list(range(usable))
    count = max(1, round(window.fraction * usable))
    trained = sorted(rng.permutation(usable, seed, rng.WINDOW, step)[:count])
    return tuple(sde), tuple(trained)

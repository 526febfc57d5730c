"""One claim, one assertion: every (step, group, sample, trained step) is trained exactly once.

A run reports what its trainers trained as (step, group, sample, t) tuples (`RayDriver.trained`:
the lead rank of every trainer reports its rows of each Train unit). Under faults, replacements,
drains and hand-overs, the claim is that this list is exactly the plan's: nothing lost, nothing
twice, nothing that was not asked for.
"""

from __future__ import annotations

from collections import Counter

from digenrl.config.schema import Config
from digenrl.train.trainer import plan_step, prompt_source


def planned_units(cfg: Config, steps: int, start: int = 0) -> Counter:
    """(step, group, sample, t) for every trained slot of RL steps [start, start + steps), as
    `plan_step` cuts them (the scheduler's own cut, digenrl.config.contract)."""
    source = prompt_source(cfg)
    out: Counter = Counter()
    for s in range(start, start + steps):
        plan = plan_step(cfg, source, s)
        out.update((*c, t) for mb in plan.micro_batches for c in mb.coords for t in plan.trained_steps)
    return out


def assert_trained_exactly_once(trained: list[tuple], cfg: Config, steps: int, start: int = 0) -> None:
    """`trained` holds each planned (step, group, sample, t) once, and nothing else."""
    got, want = Counter(tuple(x) for x in trained), planned_units(cfg, steps, start)
    twice = sorted(k for k, n in got.items() if n > 1)
    lost = sorted(want - got)
    extra = sorted(set(got) - set(want))
    assert not (twice or lost or extra), (
        f"trained twice: {twice[:5]} ({len(twice)}); never trained: {lost[:5]} ({len(lost)}); "
        f"not in the plan: {extra[:5]} ({len(extra)})")

"""Prompt sources: which prompt each group of each RL step gets.

The choice is a pure function of (seed, step, group): epoch-wise shuffles of the prompt
list, walked in order. The "data cursor" of a checkpoint is therefore just the number of
prompts consumed, and any worker can tell which prompt a group has.
"""

from __future__ import annotations

from pathlib import Path

from digenrl.math import rng


def load_prompts(spec: str, *, held_out: bool = False, progress: bool = False) -> list[str]:
    """The prompts `spec` names: 'toy' / 'toy-held-out' (the toy world's split), a named set
    ('pickscore', 'pickscore:test', ...; digenrl/prompt_sets; a bare name means the test split
    when `held_out`, else the train split) or a text file, one prompt per line."""
    if spec in ("toy", "toy-held-out"):
        from digenrl.toy.world import split_prompts

        train, held = split_prompts()
        return [p.text for p in (held if spec == "toy-held-out" else train)]
    from digenrl.prompt_sets import PROMPT_SETS, load_set, parse_spec

    if parse_spec(spec) is not None:
        return load_set(spec, held_out=held_out, progress=progress)
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"prompt file {spec!r} not found (or use 'toy' / 'toy-held-out', or a named set: "
                         f"{', '.join(PROMPT_SETS)}, NAME:SPLIT for a split)")
    prompts = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not prompts:
        raise ValueError(f"prompt file {spec!r} has no prompts")
    return prompts


class PromptSource:
    def __init__(self, prompts: list[str], seed: int, groups_per_step: int):
        self.prompts = prompts
        self.seed = seed
        self.groups_per_step = groups_per_step
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            self._perms = {epoch: rng.permutation(len(self.prompts), self.seed, rng.PROMPT, epoch)}
        return self._perms[epoch]

    def prompt(self, step: int, group: int) -> str:
        pos = step * self.groups_per_step + group
        epoch, i = divmod(pos, len(self.prompts))
        return self.prompts[self._perm(epoch)[i]]

    def step_prompts(self, step: int) -> list[str]:
        return [self.prompt(step, g) for g in range(self.groups_per_step)]

    def cursor(self, next_step: int) -> int:
        """Prompts consumed before `next_step` (saved in checkpoints for inspection)."""
        return next_step * self.groups_per_step

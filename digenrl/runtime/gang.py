"""A worker on the runtime: a gang of Ray actors, one per device (its ranks), that run each unit SPMD.

    scheduler worker "trainer-1"  ==  Gang([rank 0 actor, ..., rank N-1 actor], TrainerRank)
        gang.train(unit, ...)          as TrainerRank.train declares: every rank runs it,
                                       one result ref per rank (a unit: the driver's event loop
                                       waits for all of them and merges them, runtime/loop.py)
        gang.publish()                 every rank runs it (collectives), rank 0's result
        gang.relay_connect(address)    (a rollout worker's gang, RolloutRank) rank 0 only
        gang.kill()

Which ranks run a method and which results come back is declared once, on the worker method
(`@on_ranks`, after verl's `@register`), never decided at a call site; calling a method that
declares nothing through a gang is an error. Methods whose arguments differ per rank (a
Generate's row shares, the process-group setup) are called on `gang.ranks` by their callers.

A rollout or reward worker is a gang of one, or for a rollout worker a sequence-parallel group.
Ranks of every trainer gang form one torch.distributed world, laid out as a (gangs, gang) mesh:
FSDP2 shards over a gang's row, gradients are all-reduced down each column once per RL step
(HSDP), see `rank_layout`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ray

from digenrl.math.payload import row_share  # noqa: F401 (its home: the sim shares it)

ALL, FIRST = "all", "first"


def on_ranks(run: str = ALL, result: str = ALL) -> Callable:
    """Declare how a gang runs the decorated worker method.

    run     ALL: every rank (a unit, or a collective every rank must enter); FIRST: rank 0 only
    result  ALL: one result per rank (a unit: the event loop merges them); FIRST: rank 0's
            (the others' is the same, or nothing a caller reads)
    """
    if run not in (ALL, FIRST) or result not in (ALL, FIRST) or (run, result) == (FIRST, ALL):
        raise ValueError(f"on_ranks(run={run!r}, result={result!r}): run and result are 'all' or 'first', "
                         "and a method rank 0 alone runs has rank 0's result only")

    def mark(fn: Callable) -> Callable:
        fn.gang_dispatch = (run, result)
        return fn
    return mark


class Gang:
    """The actors (ranks) of one worker; `gang.<method>(...)` runs as the method declares."""

    def __init__(self, actors: Sequence[Any], cls: type):
        self.ranks, self.cls = list(actors), cls

    def __len__(self) -> int:
        return len(self.ranks)

    def __getattr__(self, name: str) -> "_GangMethod":
        if name.startswith("_") or name in ("ranks", "cls"):
            raise AttributeError(name)
        declared = getattr(getattr(self.cls, name, None), "gang_dispatch", None)
        if declared is None:
            raise AttributeError(f"{self.cls.__name__}.{name} declares no @on_ranks: call it on gang.ranks, "
                                 "or declare which ranks run it")
        return _GangMethod(self.ranks, name, declared, {})

    def kill(self) -> None:
        for actor in self.ranks:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass


class _GangMethod:
    def __init__(self, ranks: list, name: str, declared: tuple[str, str], options: dict):
        self.ranks, self.name, self.declared, self.opts = ranks, name, declared, options

    def options(self, **options) -> "_GangMethod":
        return _GangMethod(self.ranks, self.name, self.declared, {**self.opts, **options})

    def __call__(self, *args, **kwargs):
        """The declared ranks run it: a list of results (ref, or tuple of refs with
        num_returns) per rank for result=ALL, rank 0's alone for result=FIRST."""
        run, result = self.declared
        out = []
        for actor in self.ranks if run == ALL else self.ranks[:1]:
            method = getattr(actor, self.name)
            if self.opts:
                method = method.options(**self.opts)
            out.append(method.remote(*args, **kwargs))
        return out if result == ALL else out[0]


def rank_layout(gangs: int, gang: int) -> list[list[int]]:
    """Global ranks of each gang: gang g holds ranks g*gang .. g*gang+gang-1 (a mesh row)."""
    return [[g * gang + r for r in range(gang)] for g in range(gangs)]

"""A scheduler worker on the runtime: a gang of Ray actors, one per device, that run each unit SPMD.

    scheduler worker "trainer-1"  ==  Gang([rank 0 actor, ..., rank N-1 actor])
        gang.train.all(unit, ...)      every rank runs the unit -> [ref per rank]  (a unit: the
                                       driver's event loop waits for all of them, runtime/loop.py)
        gang.publish.remote()          every rank runs it (collectives) -> rank 0's ref (a service)
        gang.kill()

A rollout or reward worker is a gang of one (room for sequence-parallel rollout gangs). Ranks
of every trainer gang form one torch.distributed world, laid out as a (gangs, gang) mesh:
FSDP2 shards over a gang's row, gradients are all-reduced down each column once per RL step
(HSDP), see `rank_layout`.
"""

from __future__ import annotations

from typing import Any, Sequence

import ray


class Gang:
    """The actors of one scheduler worker; `gang.<method>` calls it on every rank."""

    def __init__(self, actors: Sequence[Any]):
        self.ranks = list(actors)

    def __len__(self) -> int:
        return len(self.ranks)

    def __getattr__(self, name: str) -> "_GangMethod":
        if name.startswith("_") or name == "ranks":
            raise AttributeError(name)
        return _GangMethod(self.ranks, name, {})

    def kill(self) -> None:
        for actor in self.ranks:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass


class _GangMethod:
    def __init__(self, ranks: list, name: str, options: dict):
        self.ranks, self.name, self.opts = ranks, name, options

    def options(self, **options) -> "_GangMethod":
        return _GangMethod(self.ranks, self.name, {**self.opts, **options})

    def all(self, *args, **kwargs) -> list:
        """Call every rank; one result (ref, or tuple of refs with num_returns) per rank."""
        out = []
        for actor in self.ranks:
            method = getattr(actor, self.name)
            if self.opts:
                method = method.options(**self.opts)
            out.append(method.remote(*args, **kwargs))
        return out

    def remote(self, *args, **kwargs):
        """Call every rank (a collective needs them all); rank 0's result."""
        return self.all(*args, **kwargs)[0]


def row_share(n: int, ranks: int, rank: int) -> slice:
    """Rank `rank`'s rows of a unit of n rows: contiguous, the first n % ranks ranks one more."""
    base, extra = divmod(n, ranks)
    first = rank * base + min(rank, extra)
    return slice(first, first + base + (1 if rank < extra else 0))


def rank_layout(gangs: int, gang: int) -> list[list[int]]:
    """Global ranks of each gang: gang g holds ranks g*gang .. g*gang+gang-1 (a mesh row)."""
    return [[g * gang + r for r in range(gang)] for g in range(gangs)]

"""Start a test's gloo ranks as processes forked from a server that has already imported torch.

`torch.multiprocessing.spawn` starts each rank as a fresh interpreter, which imports torch,
peft (and through it transformers) and, for a diffusers model, diffusers: 2-8 s of CPU per
rank before its first collective, more than the tiny models' work, and paid again by every
gang a test starts. `spawn_ranks` starts the ranks with the "forkserver" method instead: one
server process per test process imports `PRELOAD` once, and each rank is a fork of it (no
threads, no process group, no Ray: the server never runs test code), so a rank only imports
what its test module adds. The ranks are otherwise what `mp.spawn` gives: `fn(rank, *args)`
in a new process, joined, and a rank's exception or non-zero exit raised in the test.
"""

from __future__ import annotations

import multiprocessing
from typing import Callable

import torch.multiprocessing as mp

# What every gang test's ranks import; a module that is not installed is skipped by the server.
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "peft",  # LoRA (digenrl.models.lora); imports transformers' modelling code
    "diffusers.models.modeling_utils",  # the base of every diffusers transformer
    "digenrl.learner",
    "digenrl.rollout",
    "digenrl.models",
]


def rank_context() -> multiprocessing.context.BaseContext:
    """The "forkserver" multiprocessing context, its server (when it starts) preloading `PRELOAD`:
    for a test's own `Process`, `Queue` and `Event`."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def spawn_ranks(fn: Callable, args: tuple, nprocs: int) -> None:
    """`mp.spawn(fn, args, nprocs, join=True)`, each rank forked from the preloaded server."""
    rank_context()
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")

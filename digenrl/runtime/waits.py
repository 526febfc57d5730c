"""Deadlines for the driver's blocking waits: each one gives up with a message that names what
it waited for, who did not answer, and the config key (or constant) that sets the deadline.

    WaitTimeout                      the error (`digenrl train` prints it and exits 4)
    Unplaceable                      a placement that can never succeed, refused without waiting
    wait_all(named, timeout_s, ...)  ray.get of every named ref, or WaitTimeout naming the late ones
    within(runtime, deadline, ...)   wait_all with runtime.<deadline>_timeout_s ("start", "stall")

Which wait has which deadline: docs/guides/running.md, "Waits and their deadlines". Placement waits
(resources a worker asks for) live in runtime/cluster.py and raise the same error.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import ray


class WaitTimeout(RuntimeError):
    """A wait of the driver passed its deadline; the message says what it waited for and why."""


class Unplaceable(WaitTimeout):
    """A placement that can never succeed on this cluster (runtime/cluster.py,
    `refuse_if_infeasible`): refused at once, with the message its deadline would have given."""


def wait_all(named: Mapping[str, Any], *, timeout_s: float, what: str, key: str,
             hint: Union[str, Callable[[], str]] = "") -> dict[str, Any]:
    """`ray.get` of each value of `named` (a ref, or a list of refs), waiting at most `timeout_s`
    for all of them together. Past it, raise WaitTimeout: "`what`: no answer from <the names
    with a ref not ready> within <timeout_s> s (`key`)", then `hint` (called only then, so it
    may ask the cluster). A ref that failed counts as an answer: its error is raised here."""
    owner: dict[ray.ObjectRef, str] = {}
    for name, refs in named.items():
        for ref in refs if isinstance(refs, (list, tuple)) else [refs]:
            owner[ref] = name
    if owner:
        _, late = ray.wait(list(owner), num_returns=len(owner), timeout=timeout_s, fetch_local=False)
        if late:
            names = list(dict.fromkeys(owner[r] for r in late))  # in the order given
            more = hint() if callable(hint) else hint
            raise WaitTimeout(f"{what}: no answer from {', '.join(names)} within {timeout_s:g} s ({key})"
                              + (f"; {more}" if more else ""))
    return {name: ray.get(list(refs) if isinstance(refs, tuple) else refs) for name, refs in named.items()}


def within(runtime, deadline: str, named: Mapping[str, Any], what: str,
           hint: Union[str, Callable[[], str]] = "") -> dict[str, Any]:
    """wait_all with the deadline `runtime.<deadline>_timeout_s` of the run's config section
    `runtime` ("start": start-up and the final weights; "stall": the event loop and the
    end-of-run records), the key named in its message."""
    key = f"{deadline}_timeout_s"
    return wait_all(named, timeout_s=getattr(runtime, key), what=what, key=f"runtime.{key}", hint=hint)

"""Which ranks of a gang run a worker method, and which results come back, is declared on the
method (@on_ranks), never decided at a call site. Fake actors: no Ray cluster."""

import pytest

from digenrl.runtime.gang import ALL, FIRST, Gang, on_ranks
from digenrl.runtime.workers import RewardWorker, RolloutRank, TrainerRank


class FakeActor:
    """Records calls as a Ray actor handle would take them: actor.method.remote(...)."""

    def __init__(self, rank, calls):
        self.rank, self.calls = rank, calls

    def __getattr__(self, name):
        actor = self

        class Method:
            def options(self, **kw):
                return self

            def remote(self, *args):
                actor.calls.append((actor.rank, name, args))
                return f"ref-{actor.rank}-{name}"
        return Method()


class Worker:
    @on_ranks(ALL, ALL)
    def unit(self, x): ...

    @on_ranks(ALL, FIRST)
    def collective(self): ...

    @on_ranks(FIRST, FIRST)
    def lead(self): ...

    def per_rank(self, rank): ...


def test_each_method_runs_on_the_ranks_it_declares():
    calls = []
    gang = Gang([FakeActor(r, calls) for r in range(3)], Worker)
    assert gang.unit(1) == ["ref-0-unit", "ref-1-unit", "ref-2-unit"]
    assert gang.collective() == "ref-0-collective" and [c[0] for c in calls if c[1] == "collective"] == [0, 1, 2]
    assert gang.lead() == "ref-0-lead" and [c[0] for c in calls if c[1] == "lead"] == [0]
    assert gang.unit.options(num_returns=2)(2) == ["ref-0-unit", "ref-1-unit", "ref-2-unit"]
    with pytest.raises(AttributeError, match="declares no @on_ranks"):
        gang.per_rank(0)
    with pytest.raises(ValueError):
        on_ranks(FIRST, ALL)


def test_the_workers_declare_every_unit_method():
    for cls, names in ((RolloutRank, ("reward", "load_weights", "receive_weights", "relay_connect", "ready",
                                      "shutdown")),
                       (TrainerRank, ("reward", "train", "optimizer_step", "load_weights", "publish", "save",
                                      "load", "final_state", "evaluate", "eval_weights", "ready", "shutdown")),
                       (RewardWorker, ("reward", "ready", "shutdown"))):
        for name in names:
            assert getattr(getattr(cls, name), "gang_dispatch", None), f"{cls.__name__}.{name}"


def test_each_role_has_one_rank_class():
    """runtime/actors.py picks a worker's rank class by its role, once: every role has one."""
    from digenrl.runtime.actors import ROLE_CLASS
    from digenrl.sched.units import ROLES

    assert set(ROLE_CLASS) == set(ROLES)
    assert ROLE_CLASS["trainer"] is ROLE_CLASS["colocated"] is TrainerRank

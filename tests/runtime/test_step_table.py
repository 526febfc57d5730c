"""The step table (runtime/backend.STEP_TABLE) is the code's own map of a unit's way through a
Ray run: unit kind -> scheduler event -> backend call -> worker method -> what it feeds. These
checks keep every name in it real, so the table (and docs/design/step.md's "A step, unit by unit",
which follows it) cannot drift from the code. No Ray cluster is started."""

from digenrl.runtime import workers
from digenrl.runtime.backend import STEP_TABLE, RealBackend
from digenrl.sched import KINDS, Scheduler, Worker
from digenrl.sched.config import SchedConfig


def test_every_unit_kind_has_one_route():
    assert set(STEP_TABLE) == set(KINDS)


def test_each_event_is_the_scheduler_handler_of_that_kind():
    sched = Scheduler(SchedConfig(mode="digenrl", rl_steps=1, groups_per_step=2, samples_per_group=2, num_steps=2,
                                  micro_batch_groups=1),
                      [Worker("rollout-0", "rollout"), Worker("trainer-0", "trainer")])
    for kind, route in STEP_TABLE.items():
        assert sched._on_complete[kind].__name__ == route.event, kind


def test_each_call_and_done_is_the_backends_and_each_method_a_workers():
    for kind, route in STEP_TABLE.items():
        for fn in (route.call, route.done):
            assert getattr(RealBackend, fn.__name__) is fn, (kind, fn)
        for name in route.methods:
            cls, _, method = name.partition(".")
            assert callable(getattr(getattr(workers, cls), method, None)), (kind, name)

"""The engine's fast paths against their references, the same trace span for span: quiet_syncs (no
assign() after a weight sync that cannot have created work) and batched (units that end together
share one heap entry)."""

import pytest

from digenrl.sched import Scheduler
from digenrl.sim.costs import default_cost_model
from digenrl.sim.engine import run_virtual
from digenrl.sim.report import spec_duration_fn
from digenrl.sim.testbed import load_testbed, resize
from digenrl.sim.workload import RunSpec

SMALL = "small-h200x16-sd35"
# Big idle rollout pools (most events are syncs), TAG (trainers generate, with a reserve that
# counts syncing and idle rollout workers), lag 0 and lag 1, eager syncs (tcss, digenrl)
SPECS = [
    (64, RunSpec("digenrl", n_rollout=56, gen_shard=4, train_shard=4)),
    (64, RunSpec("digenrl", n_rollout=8, micro_batch_groups=2, tag_segment=1)),
    (16, RunSpec("gap+tsp+tag", n_rollout=10, tag_segment=2)),
    (32, RunSpec("one-step-off", n_rollout=24, samples_per_group=1)),
    (32, RunSpec("disagg-sync", n_rollout=20, samples_per_group=1)),
]


def _trace(tb, spec, **flags):
    """The trace of `spec` on `tb` for 6 RL steps, run_virtual's fast paths set by `flags`."""
    _, run, fn = spec_duration_fn(tb, spec, 6, default_cost_model())
    return run_virtual(Scheduler(run.sched, run.workers()), fn, **flags)


@pytest.mark.parametrize("gpus,spec", SPECS + [(16, RunSpec("gap", n_rollout=12, gen_shard=2))])
def test_quiet_syncs_same_trace(gpus, spec):
    tb = resize(load_testbed(SMALL), gpus)
    fast, ref = _trace(tb, spec, quiet_syncs=True), _trace(tb, spec, quiet_syncs=False)
    assert fast.spans == ref.spans and fast.end == ref.end and fast.alive == ref.alive
    assert sum(s.kind == "sync" for s in ref.spans) > 0


@pytest.mark.parametrize("gpus,spec", SPECS + [(16, RunSpec("colocated", micro_batch_groups=2))])
def test_batched_same_trace(gpus, spec):
    """Units launched together that end together share one heap entry (run_virtual batched):
    the same trace, span for span, as one entry each."""
    tb = resize(load_testbed(SMALL), gpus)
    fast, ref = _trace(tb, spec, batched=True), _trace(tb, spec, batched=False)
    assert fast.spans == ref.spans and fast.end == ref.end and fast.alive == ref.alive
    assert fast.n_events == ref.n_events

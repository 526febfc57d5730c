"""Level 2 vs level 3 (DESIGN.md sec. 3): the emulated runtime (16 Ray actors sleeping the cost
model's time, the real EventLoop and Scheduler) and the simulator agree on throughput.

Every mode on `small-h200x16-sd35`, each with the planner's knobs (as `digenrl simulate`),
12 RL steps, measured over the same steady-state window by the same code (report.measure).
Ray round trips are not charged here (latency="hidden": the simulator models none); what is
compared is the schedule the runtime builds from real completions. Round trips at their real
size (latency="real") are the runtime's own overhead: see `digenrl bench --emulated` and
benchmarks/emulated_vs_sim.py.
"""

import time
from collections import Counter

import pytest

ray = pytest.importorskip("ray")

from digenrl.bench import emulate_spec  # noqa: E402
from digenrl.runtime.emulated import ActorPool  # noqa: E402
from digenrl.sim.planner import PLAN_STEPS, plan  # noqa: E402
from digenrl.sim.costs import default_cost_model  # noqa: E402
from digenrl.sim.report import run_spec  # noqa: E402
from digenrl.sim.simulate import ROWS, row_name  # noqa: E402
from digenrl.sim.testbed import load_testbed  # noqa: E402

MODES = ("colocated", "disagg-sync", "one-step-off", "gap", "gap+tsp", "gap+tsp+tag", "digenrl")
# wall s per modelled s: the preset's units are 2.6 ms (syncs) to 0.5 s, a step ~1.2 s, so a
# mode runs ~4-6 s; round trips here are 10-30 ms, which the units must mostly absorb
# (at 0.1 the wall clock trails the modelled one and completions arrive out of order).
TIME_SCALE = 0.3


@pytest.fixture(scope="module")
def actors():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    pool = ActorPool()
    pool.warm(16)
    yield pool
    pool.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def small():
    return load_testbed("small-h200x16-sd35")


def _emulate(actors, small, label):
    cm = default_cost_model()
    mode, style = ROWS[row_name(label)]  # run.mode=colocated: the colocated-ideal row
    spec = plan(small, mode=mode, style=style, steps=PLAN_STEPS, cm=cm).spec
    sim = run_spec(small, spec, PLAN_STEPS, cm, keep_trace=True)
    t0 = time.time()
    emu = emulate_spec(small, spec, PLAN_STEPS, TIME_SCALE, cm, latency="hidden", pool=actors, keep_trace=True)
    return sim, emu, time.time() - t0


@pytest.mark.parametrize("label", MODES)
def test_emulated_runtime_runs_the_simulated_schedule(actors, small, label):
    sim, emu, _ = _emulate(actors, small, label)
    assert len(emu.fn.layout.workers) == 16 and emu.n_gpus == sim.n_gpus
    assert {s.kind for s in emu.trace.spans} == {s.kind for s in sim.trace.spans}
    assert _work(emu.trace) == _work(sim.trace)  # every unit ran once
    assert emu.staleness_max == sim.staleness_max


def _work(trace):
    """What a run did, independent of timing: how many units of each kind other than Generate,
    and for each micro-batch (shard) the denoising steps generated. Under TAG the number of
    Generate spans depends on when training work arrives (a trainer hands a trajectory over at
    the next segment boundary), so span counts may differ while the work is the same."""
    other = Counter(s.kind for s in trace.spans if s.kind != "generate")
    steps = Counter()
    for s in trace.spans:
        if s.kind == "generate":
            u = s.unit
            steps[(u.step, u.mb, u.samples)] += u.t_end - u.t_start
    return other, steps


@pytest.mark.timing
@pytest.mark.parametrize("label", MODES)
def test_emulated_throughput_matches_simulator(actors, small, label):
    # Wall-clock agreement: on a shared 2-core machine a busy neighbour costs a few percent
    # (one CI run measured -7.4% for digenrl), so this runs on request (-m timing).
    sim, emu, wall = _emulate(actors, small, label)
    rel = emu.throughput / sim.throughput - 1.0
    print(f"{label}: simulated {sim.throughput:.3f}, emulated {emu.throughput:.3f} samples/s ({100 * rel:+.2f}%), "
          f"{wall:.1f} s wall, round trip {emu.latency}")
    assert abs(rel) <= 0.05, (label, sim.throughput, emu.throughput, emu.latency)

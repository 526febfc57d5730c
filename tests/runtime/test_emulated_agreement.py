"""Level 2 (emulated compute) vs level 3 (simulator): the emulated runtime (16 Ray actors sleeping the cost
model's time, the real EventLoop and Scheduler) and the simulator.

Every mode on `small-h200x16-sd35`, each with the planner's knobs (as `digenrl simulate`),
12 RL steps. With Ray round trips not charged (latency="hidden": the simulator models none) the
emulated runtime delivers completions in modelled order, so it must run the simulator's
schedule exactly, unit for unit, whatever the machine's load. Round trips at their real size
(latency="real") are the runtime's own overhead, a wall-clock matter: the timing tier below,
`digenrl bench --emulated` and benchmarks/emulated_vs_sim.py.
"""

import time

import pytest

ray = pytest.importorskip("ray")

from digenrl.tools.bench import emulate_spec  # noqa: E402
from digenrl.runtime.emulated import ActorCache  # noqa: E402
from digenrl.sim.planner import PLAN_STEPS, plan  # noqa: E402
from digenrl.sim.costs import default_cost_model  # noqa: E402
from digenrl.sim.report import run_spec  # noqa: E402
from digenrl.sim.simulate import mode_and_style  # noqa: E402
from digenrl.sim.testbed import load_testbed  # noqa: E402

MODES = ("colocated", "disagg-sync", "one-step-off", "gap", "gap+tsp", "gap+tsp+tag", "digenrl")
# wall s per modelled s. hidden latency: the order is exact at any scale, so the runs are short;
# real latency: the preset's units are 2.6 ms (syncs) to 0.5 s, a step ~1.2 s, round trips here
# 10-30 ms, which the units must mostly absorb.
HIDDEN_SCALE, REAL_SCALE = 0.02, 0.3


@pytest.fixture(scope="module")
def actors(ray_cluster):
    cache = ActorCache()  # actors of 0 CPUs on the shared cluster
    cache.warm(16)
    yield cache
    cache.close()


@pytest.fixture(scope="module")
def small():
    return load_testbed("small-h200x16-sd35")


def _emulate(actors, small, label, latency):
    cm = default_cost_model()
    mode, style = mode_and_style(label)  # run.mode=colocated: the runtime's colocated mode
    spec = plan(small, mode=mode, style=style, steps=PLAN_STEPS, cm=cm).spec
    sim = run_spec(small, spec, PLAN_STEPS, cm, keep_trace=True)
    t0 = time.time()
    scale = HIDDEN_SCALE if latency == "hidden" else REAL_SCALE
    emu = emulate_spec(small, spec, PLAN_STEPS, scale, cm, latency=latency, cache=actors, keep_trace=True)
    return sim, emu, time.time() - t0


def _schedule(trace):
    """Every unit with its worker and modelled start and end, in order of completion."""
    return [(s.worker, s.kind, s.unit, s.start, s.end)
            for s in sorted(trace.spans, key=lambda s: (s.end, s.start, s.worker))]


# the default tier: the default mode (TAG where BTS inserts it); every mode in the slow tier
@pytest.mark.parametrize("label", [m if m == "digenrl" else pytest.param(m, marks=pytest.mark.slow)
                                   for m in MODES])
def test_emulated_runtime_runs_the_simulated_schedule(actors, small, label):
    sim, emu, _ = _emulate(actors, small, label, "hidden")
    assert len(emu.fn.layout.workers) == 16 and emu.n_gpus == sim.n_gpus
    assert _schedule(emu.trace) == _schedule(sim.trace)
    assert emu.throughput == sim.throughput and emu.staleness_max == sim.staleness_max


@pytest.mark.timing
@pytest.mark.parametrize("label", MODES)
def test_emulated_throughput_matches_simulator(actors, small, label):
    # Wall clock with every Ray round trip charged: on a shared 2-core machine a busy
    # neighbour costs a few percent, so this runs on request (-m timing).
    sim, emu, wall = _emulate(actors, small, label, "real")
    rel = emu.throughput / sim.throughput - 1.0
    print(f"{label}: simulated {sim.throughput:.3f}, emulated {emu.throughput:.3f} samples/s ({100 * rel:+.2f}%), "
          f"{wall:.1f} s wall, round trip {emu.latency}")
    assert abs(rel) <= 0.05, (label, sim.throughput, emu.throughput, emu.latency)

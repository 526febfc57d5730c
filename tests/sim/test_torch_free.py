"""The planner's side needs no torch: `digenrl plan`, `digenrl simulate` and the emulated
runtime's actors import the configuration, the scheduler and the cost model, never the
tensors (torch costs about 1.8 s per process, and an emulated run starts one actor per
simulated GPU). Only a random SDE window (contiguous, fraction) draws from torch's generator
(digenrl.math.rng), in the process that builds the run's contract."""

import pickle
import subprocess
import sys

HEAVY = ("torch", "numpy", "diffusers", "peft", "transformers")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_the_planner_and_the_emulated_runtime_import_no_torch():
    loaded = _run("import sys; import digenrl.sim.planner, digenrl.sim.cli, digenrl.sim.simulate, "
                  "digenrl.runtime.emulated, digenrl.tools.bench, digenrl.config.schema; "
                  f"print([m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded == "[]"


def test_an_emulated_actor_unpickles_and_runs_a_duration_fn_without_torch(tmp_path):
    # what EmulatedWorker.configure receives, then one unit of each kind timed as the actor does
    from digenrl.sched import Scheduler
    from digenrl.sim.costs import default_cost_model
    from digenrl.sim.engine import run_virtual
    from digenrl.sim.report import spec_duration_fn
    from digenrl.sim.testbed import load_testbed
    from digenrl.sim.workload import RunSpec

    tb = load_testbed("small-h200x16-sd35")
    _, run, fn = spec_duration_fn(tb, RunSpec(mode="digenrl", n_rollout=8), 2, default_cost_model())
    units = {}

    def first_of_each_kind(w, u):
        units.setdefault(type(u).__name__, (w, u))
        return fn(w, u)

    run_virtual(Scheduler(run.sched, fn.layout.workers), first_of_each_kind)
    assert {"Generate", "Reward", "Train", "OptimizerStep", "WeightSync"} <= set(units)
    path = tmp_path / "fn.pkl"
    path.write_bytes(pickle.dumps((fn, list(units.values()), [fn(w, u) for w, u in units.values()])))
    loaded = _run("import pickle, sys; "
                  f"fn, units, want = pickle.loads(open({str(path)!r}, 'rb').read()); "
                  "assert [fn(w, u) for w, u in units] == want; "
                  f"print([m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded == "[]"

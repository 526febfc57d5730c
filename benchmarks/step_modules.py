"""Which digenrl modules one RL step of the Ray runtime runs code in, driver and workers.

    python benchmarks/step_modules.py [--mode digenrl] [--steps 3] [--step 1]

A tiny run (the runtime tests' shape: 4 groups x 2 samples, 4 denoising steps, one rollout
worker, one trainer) on a local Ray cluster. A profile hook in the driver and, through Ray's
`worker_process_setup_hook`, in every worker process records when each digenrl module's
Python functions are called (time.time(), in 50 ms buckets). The window of RL step s runs from
the driver's dispatch of step s's first unit to the dispatch of step s+2's first unit (under
TCSS step s+1 starts before step s ends: this window holds every unit of step s, and of step
s+1 all but its last); a module counts when any of its functions ran in that window, in any
process. Printed: the
modules by side (driver, workers), their count, and the count of top-level parts.

The hook slows the run (every Python call goes through it); the count does not depend on
speed, only on which code the step runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

BUCKET_S = 0.05


def install() -> None:
    """Record (module, calling module, bucket) of every digenrl function call of this process into
    $STEP_MODULES_DIR/<pid>.txt (flushed as it goes: Ray kills actors without atexit)."""
    out = Path(os.environ["STEP_MODULES_DIR"]) / f"{os.getpid()}.txt"
    seen: set[tuple[str, int]] = set()
    lock = threading.Lock()
    f = open(out, "a", buffering=1)

    def hook(frame, event, arg):
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("digenrl"):
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        key = (name, caller if caller.startswith("digenrl") else "-", int(time.time() / BUCKET_S))
        if key not in seen:
            with lock:
                if key not in seen:
                    seen.add(key)
                    f.write(" ".join(map(str, key)) + "\n")

    sys.setprofile(hook)
    threading.setprofile(hook)


def read(folder: Path, driver_pid: int, lo: float, hi: float) -> dict[str, set[tuple[str, str]]]:
    """side (driver | workers) -> {(module, calling module or '-')} called in [lo, hi) buckets."""
    sides: dict[str, set[tuple[str, str]]] = {"driver": set(), "workers": set()}
    for path in folder.glob("*.txt"):
        side = sides["driver" if path.stem == str(driver_pid) else "workers"]
        for line in path.read_text().splitlines():
            module, caller, bucket = line.split(" ")
            if lo <= int(bucket) < hi:
                side.add((module, caller))
    return sides


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="digenrl")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--step", type=int, default=1, help="the RL step whose window counts (0-based)")
    args = ap.parse_args(argv)
    if not 0 <= args.step < args.steps - 2:
        ap.error("--step must be below --steps - 2 (the window ends at step+2's first unit)")

    import ray

    from digenrl.config.schema import load_config
    from digenrl.runtime.driver import RayDriver

    folder = Path(tempfile.mkdtemp(prefix="step_modules_"))
    os.environ["STEP_MODULES_DIR"] = str(folder)
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join([here, str(Path(here).parent), os.environ.get("PYTHONPATH", "")])
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "step_modules.install",
                          "env_vars": {"STEP_MODULES_DIR": str(folder), "PYTHONPATH": path}})
    first: dict[int, float] = {}

    def on_dispatch(trainer, worker_id, unit) -> None:
        if getattr(unit, "step", None) is not None:  # a weight sync belongs to a version, not a step
            first.setdefault(unit.step, time.time())

    run = folder / "run"
    cfg = load_config(None, [
        f"run.run_dir={run}", f"run.mode={args.mode}", "run.tensorboard=false", f"train.steps={args.steps}",
        "run.eval_every=0", "data.groups_per_step=4", "data.group_size=2", "data.micro_batch_groups=1",
        "sampling.num_steps=4", "reward.threads=1", "runtime.rollout.workers=1", "runtime.trainer.workers=1"])
    install()
    try:
        RayDriver(cfg, progress=False, evaluate=False, on_dispatch=on_dispatch).train()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        ray.shutdown()
    lo, hi = first[args.step] / BUCKET_S, first[args.step + 2] / BUCKET_S
    sides = read(folder, os.getpid(), lo, hi)
    inside = {side: sorted({m for m, _ in calls}) for side, calls in sides.items()}
    every = sorted(set(inside["driver"]) | set(inside["workers"]))
    print(f"run.mode={args.mode}: RL step {args.step}'s window "
          f"{(first[args.step + 2] - first[args.step]):.2f} s (to step {args.step + 2}'s first unit)")
    for side, mods in inside.items():
        edges = {(c, m) for m, c in sides[side] if c != "-" and c != m}
        trips = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})
        print(f"{side}: {len(mods)} modules, {len(edges)} module-to-module call edges, "
              f"{len(trips)} round trips (A calls B and B calls A)")
        for m in mods:
            out = sorted(callee for caller, callee in edges if caller == m)
            print(f"    {m}" + (f"  -> {', '.join(x.removeprefix('digenrl.') for x in out)}" if out else ""))
        for a_, b_ in trips:
            print(f"    round trip: {a_} <-> {b_}")
    parts = sorted({m.split(".")[1] for m in every if "." in m})
    print(f"one RL step runs code in {len(every)} digenrl modules "
          f"({len(inside['driver'])} driver, {len(inside['workers'])} workers) of {len(parts)} parts: "
          f"{', '.join(parts)}")

if __name__ == "__main__":
    main()

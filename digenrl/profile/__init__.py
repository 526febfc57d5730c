"""Measuring what the simulator's cost model is calibrated from, with the project's own code.

    timing.py          timer (median of repeats, CUDA events) and PeakMemory
    targets.py         Target: the profiled policy and the names its records carry
    workload.py        Workload: the measured micro-batch, built by digenrl.rollout
    measure.py         Profiler: one method per measurement (sampler step, Learner.accumulate, ...)
    calibration_io.py  calibration JSONL files: read, merge, fill from the H200 file
    cli.py             `digenrl profile` (profile_main): the file format and its options
    run.py             profile_run(cfg): the run at hand, for a planner

The measurements call the sampler (`rollout.sampler.denoise_step`) and the learner
(`Learner.accumulate`, `Learner.optimizer_step`) themselves, so what is timed is what the
runtime runs.
"""

from digenrl.profile.calibration_io import load_calibration_file, merge_records, write_jsonl
from digenrl.profile.cli import profile_main
from digenrl.profile.measure import Profiler
from digenrl.profile.run import profile_run
from digenrl.profile.timing import PeakMemory, timer

__all__ = ["PeakMemory", "Profiler", "load_calibration_file", "merge_records", "profile_main", "profile_run",
           "timer", "write_jsonl"]

"""Where a CPU run's cores go: CPU seconds per process role while `digenrl train` runs its RL steps.

    python benchmarks/run_cpu.py [--json FILE] [key=value ...]

Runs `python -m digenrl.tools.cli train run.run_dir=<tmp> <key=value ...>` and, from this one
process (no subprocess per sample, so the watcher itself costs little), reads every process's
user + system CPU ticks from /proc/<pid>/stat every --every seconds. The window is the run's RL
steps: from the moment its trace.jsonl appears (the driver opens it as its event loop starts) to
that moment plus the trace's last span end (the run's clock starts at the loop's start), within
one sample; the start-up, the profile and the planning are outside it. Processes are grouped by
role from their command line:

- driver: the `digenrl train` process (scheduler, backend, recorder);
- one row per Ray actor class (ray::TrainerRank, ray::RolloutRank, ray::EvalWorker, ...);
- ray daemons: raylet, gcs_server, the dashboard agents, log monitor;
- other: everything else on the machine (this watcher included).

It prints each role's CPU seconds in the window, its share of the window's capacity (window x
cores), and the run's own "achieved/predicted" line. Linux only (/proc).

What it answers (issue 39, the run at hand): the planner charges each unit its profiled compute
scaled by the shared-core factor; CPU the run spends elsewhere (the driver, Ray's per-unit
serialisation in the workers, the evaluation actor) is in these rows and not in the charge.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_ticks() -> dict[int, tuple[int, str]]:
    """pid -> (user + system ticks, command line) of every process readable now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(name)] = (int(fields[11]) + int(fields[12]), cmd or stat[stat.index("(") + 1:stat.rindex(")")])
    return out


def role(pid: int, cmd: str, driver: int) -> str:
    if pid == driver:
        return "driver"
    m = re.match(r"ray::(\w+)", cmd)
    if m:
        return f"ray::{m.group(1)}"
    if any(k in cmd for k in ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env")):
        return "ray daemons"
    return "other"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="key=value config overrides for the run")
    p.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args()
    if not Path("/proc/self/stat").exists():
        sys.exit("run_cpu.py reads /proc: Linux only")
    tick = os.sysconf("SC_CLK_TCK")
    from digenrl.io.trace import iter_spans

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "run" / "trace.jsonl"
        cmd = [sys.executable, "-m", "digenrl.tools.cli", "train", f"run.run_dir={tmp}/run", *a.overrides]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        samples: list[tuple[float, dict]] = []
        opened: list[float] = []  # when trace.jsonl was first seen
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                now = time.time()
                if not opened and trace.exists():
                    opened.append(now)
                samples.append((now, cpu_ticks()))
                done.wait(a.every)

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        lines = list(proc.stdout)
        rc = proc.wait()
        done.set()
        w.join()
        if rc != 0 or not opened:
            sys.stdout.write("".join(lines[-30:]))
            sys.exit(f"the run exited {rc}{'' if opened else ' before its event loop started'}: nothing to measure")
        t0 = opened[0]
        t1 = t0 + max(s.end for s in iter_spans(trace))
    window = [s for s in samples if t0 <= s[0] <= t1]
    if len(window) < 2:
        sys.exit(f"only {len(window)} samples in the RL steps' window: lower --every")
    span = window[-1][0] - window[0][0]
    cores = os.cpu_count() or 1
    start, end, cmds = window[0][1], {}, {}
    for _, snap in window:  # a process's last reading in the window (one that exited keeps its last)
        for pid, (ticks, cmdline) in snap.items():
            end[pid], cmds[pid] = ticks, cmdline
    by_role: dict[str, float] = {}
    for pid, ticks in end.items():
        r = role(pid, cmds[pid], proc.pid)  # (a process started in the window counts from 0)
        by_role[r] = by_role.get(r, 0.0) + (ticks - start.get(pid, (0, ""))[0]) / tick
    total = sum(by_role.values())
    print(f"RL steps: {span:.1f} s wall on {cores} cores ({span * cores:.1f} CPU s of capacity), "
          f"{total:.1f} CPU s used ({100 * total / (span * cores):.0f}%)")
    for r, s in sorted(by_role.items(), key=lambda kv: -kv[1]):
        print(f"  {r:<24} {s:7.2f} CPU s  {100 * s / (span * cores):5.1f}% of capacity")
    summary = [ln.strip() for ln in lines if "achieved/predicted" in ln]
    print(summary[-1] if summary else "(no achieved/predicted line)")
    if a.json:
        Path(a.json).write_text(json.dumps({"window_s": span, "cores": cores, "cpu_s": by_role,
                                            "summary": summary[-1] if summary else None}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

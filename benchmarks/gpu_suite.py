"""Every GPU check this project owes, in one run that fits a short loan of one GPU.

    python benchmarks/gpu_suite.py --out gpu_suite.json          # on the GPU machine, first thing
    python benchmarks/gpu_suite.py --dry-run --out dry.json      # CPU: the same wiring, tiny models

The checks, in order (each a subprocess in its own process group, stopped at its own budget):

    gpu_check        benchmarks/gpu_check.py --models sd3,flux: adapter overhead vs bare diffusers,
                     ratio == 1 in bf16 (SD3.5-medium 512^2, FLUX.1-dev 1024^2, random weights)
    profile_sd3      digenrl profile --arch sd3 --random: the calibration records of this GPU
    profile_flux     digenrl profile --arch flux --random
    pytest_gpu       pytest -m gpu: the GPU tier (ratio == 1 on CUDA, checkpoint and resume)
    gpu_gang_check   benchmarks/gpu_gang_check.py --models sd3,flux: FSDP2 training memory at
                     world size 1 against the memory model, the relay's copy rates, SP forward
    gpu_load_check   benchmarks/gpu_load_check.py: peak memory of a trainer rank (gang of 1, 2, 4)
                     during load (whole vs sharded) and one training step, beside sim/memory.py
                     (FLUX.1-dev width, 2+2 blocks, ~1.03B random weights)
    gpu_relay_check  benchmarks/gpu_relay_check.py: a training step's time alone and with the
                     relay publishing after every step (its own stream; a receiver on a second
                     GPU if there is one), and host syncs per step by thread (sync debug mode)

The budgets add up to BUDGET_S (575 s), under the 10 minutes of device time the suite may take
(issue 40); they are estimates (nothing has run on a GPU yet): a check past its budget is stopped and
recorded as `timeout`, with what it printed so far, and the next one runs. `--out FILE` is
rewritten after every check, so a suite cut short still leaves the checks that finished.

The JSON: {suite, dry_run, host, torch, cuda, device, started, total_s, budget_s, checks: [{name,
cmd, budget_s, wall_s, status (pass | fail | timeout | error), returncode, figures (the check's
own JSON output, parsed), log_tail}]}. Exit status 0 when every check passed, else 1.

--dry-run runs the same checks on the CPU with their tiny variants (gpu_check --tiny, profile
--tiny, gpu_gang_check --tiny; pytest -m gpu skips without CUDA) to prove the suite starts,
budgets and writes its JSON without a GPU (tests/test_gpu_suite.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
LOG_TAIL = 4000  # characters of each check's output kept in the JSON


@dataclass(frozen=True)
class Check:
    name: str
    budget_s: float  # on the GPU
    command: Callable[[Path, bool], list[str]]  # (output folder, dry run) -> argv
    figures: Callable[[Path, str], object]  # (output folder, stdout) -> parsed figures
    dry_budget_s: float = 300.0  # --dry-run: the tiny variant on a CPU (a shared 2-core machine)


def _json_file(name: str):
    def read(out: Path, stdout: str):
        path = out / name
        return json.loads(path.read_text()) if path.exists() else None
    return read


def _jsonl_file(name: str):
    def read(out: Path, stdout: str):
        path = out / name
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else None
    return read


def _last_json_line(out: Path, stdout: str):
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _junit(name: str):
    def read(out: Path, stdout: str):
        path = out / name
        if not path.exists():
            return None
        import xml.etree.ElementTree as ET

        suite = ET.parse(path).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return read


def _profile(arch: str):
    def command(out: Path, dry: bool) -> list[str]:
        device = ["--tiny", "--device", "cpu", "--warmup", "0", "--iters", "1"] if dry else ["--device", "cuda"]
        return [PY, "-m", "digenrl.tools.cli", "profile", "--arch", arch, "--random", *device,
                "--out", str(out / f"profile_{arch}.jsonl")]
    return command


CHECKS = (
    Check("gpu_check", 120,
          lambda out, dry: [PY, "benchmarks/gpu_check.py", *(["--tiny"] if dry else ["--models", "sd3,flux"]),
                            "--json", str(out / "gpu_check.json")],
          _json_file("gpu_check.json")),
    Check("profile_sd3", 50, _profile("sd3"), _jsonl_file("profile_sd3.jsonl")),
    Check("profile_flux", 70, _profile("flux"), _jsonl_file("profile_flux.jsonl")),
    Check("pytest_gpu", 100,
          lambda out, dry: [PY, "-m", "pytest", "-m", "gpu", "-n", "0", "-q", "-p", "no:cacheprovider",
                            f"--junitxml={out / 'pytest_gpu.xml'}"],
          _junit("pytest_gpu.xml")),
    Check("gpu_gang_check", 120,
          lambda out, dry: [PY, "benchmarks/gpu_gang_check.py", *(["--tiny"] if dry else ["--models", "sd3,flux"])],
          _last_json_line),
    Check("gpu_load_check", 75,
          lambda out, dry: [PY, "benchmarks/gpu_load_check.py", *(["--tiny", "--device", "cpu"] if dry else [])],
          _last_json_line),
    Check("gpu_relay_check", 40,
          lambda out, dry: [PY, "benchmarks/gpu_relay_check.py", *(["--tiny"] if dry else [])],
          _last_json_line),
)
BUDGET_S = sum(c.budget_s for c in CHECKS)


def run_check(check: Check, out: Path, dry: bool, budget_s: Optional[float] = None) -> dict:
    """Run one check to completion or to its budget; its record for the JSON."""
    budget = budget_s if budget_s is not None else check.dry_budget_s if dry else check.budget_s
    argv = check.command(out, dry)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    status = None
    try:
        output, _ = proc.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the check and whatever it started (process group)
        output, _ = proc.communicate()
        status = "timeout"
    wall = time.monotonic() - t0
    try:
        figures = check.figures(out, output or "")
    except (OSError, ValueError) as e:  # a half-written file: the check's own failure shows in the log
        figures = {"unreadable": f"{type(e).__name__}: {e}"}
    if status is None:
        status = "pass" if proc.returncode == 0 else "fail"
    return {"name": check.name, "cmd": " ".join(argv), "budget_s": budget, "wall_s": round(wall, 2),
            "status": status, "returncode": proc.returncode, "figures": figures,
            "log_tail": (output or "")[-LOG_TAIL:]}


def environment() -> dict:
    info = {"host": platform.node(), "python": platform.python_version()}
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda,
                    device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    except Exception as e:  # noqa: BLE001 - the suite still runs and records why
        info["torch"] = f"unavailable: {type(e).__name__}: {e}"
    return info


def main(argv=None, checks: tuple[Check, ...] = CHECKS) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write (rewritten after every check)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny variants: prove the wiring without a GPU")
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(c.name for c in CHECKS))
    ap.add_argument("--budget", action="append", default=[], metavar="NAME=SECONDS",
                    help="override one check's budget (repeatable)")
    args = ap.parse_args(argv)

    names = [c.name for c in checks]
    only = args.only.split(",") if args.only else names
    unknown = [n for n in only if n not in names]
    budgets = {}
    for item in args.budget:
        name, _, value = item.partition("=")
        if name not in names or not value:
            ap.error(f"--budget {item!r}: expected NAME=SECONDS with NAME one of {', '.join(names)}")
        budgets[name] = float(value)
    if unknown:
        ap.error(f"--only: unknown check(s) {unknown}; allowed: {', '.join(names)}")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            ap.error("no CUDA device: run this on the GPU machine, or --dry-run to check the wiring on a CPU")

    out_file = Path(args.out).resolve()
    out_dir = out_file.with_suffix("") if out_file.suffix else out_file.parent / (out_file.name + "_files")
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {"suite": "gpu_suite", "dry_run": args.dry_run, **environment(),
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "budget_s": sum(budgets.get(c.name, c.dry_budget_s if args.dry_run else c.budget_s)
                              for c in checks if c.name in only), "checks": []}
    t0 = time.monotonic()
    for check in checks:
        if check.name not in only:
            continue
        print(f"[gpu_suite] {check.name} ...", flush=True)
        record = run_check(check, out_dir, args.dry_run, budgets.get(check.name))
        report["checks"].append(record)
        report["total_s"] = round(time.monotonic() - t0, 2)
        out_file.write_text(json.dumps(report, indent=1))
        print(f"[gpu_suite] {check.name}: {record['status']} in {record['wall_s']:.1f} s "
              f"(budget {record['budget_s']:.0f} s)", flush=True)
    report["total_s"] = round(time.monotonic() - t0, 2)
    out_file.write_text(json.dumps(report, indent=1))
    failed = [c["name"] for c in report["checks"] if c["status"] != "pass"]
    print(f"[gpu_suite] {len(report['checks']) - len(failed)}/{len(report['checks'])} passed in "
          f"{report['total_s']:.0f} s; JSON: {out_file}" + (f"; not passed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

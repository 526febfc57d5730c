#!/usr/bin/env python3
"""The flake budget: run the full CI test suite N times on a clean clone; list every test that
failed in any run.

    python .ci/flake_budget.py --runs 3            # HEAD of this repository
    python .ci/flake_budget.py --runs 1 --rev main --tiers default

A clean clone (`git clone` of the committed tree at --rev, nothing uncommitted) is made once
in a temporary folder and imported from there (PYTHONPATH, which Ray's workers inherit), with
CI=true; the packages are whatever this Python has (`.ci/run` installs them). Each run is the
README's two commands, as `.ci/run` runs them: the default tier, then every other CPU tier.
pytest writes a JUnit XML per command; the script reads failures and errors from those, prints
one line per (run, tier) with its counts and wall time, then every test that failed at least
once and in how many runs. Exit status 1 if any test failed, else 0.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# The README's test commands (.ci/run runs the same two, in this order)
TIERS = {
    "default": [],
    "other": ["-m", "slow or nodes or chaos or load"],
}


def junit_outcomes(path: Path) -> dict[str, str]:
    """test id -> passed | failed | error | skipped, from a pytest JUnit XML file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                     else "skipped" if "skipped" in kinds else "passed")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rev", default="HEAD", help="the commit to clone (default HEAD)")
    p.add_argument("--tiers", default="default,other", help="which of: " + ", ".join(TIERS))
    p.add_argument("--workdir", help="where to clone (default: a new temporary folder)")
    args = p.parse_args(argv)
    tiers = args.tiers.split(",")
    unknown = [t for t in tiers if t not in TIERS]
    if unknown or args.runs < 1:
        p.error(f"--tiers: unknown {unknown}; allowed {list(TIERS)}" if unknown else "--runs must be >= 1")

    repo = Path(__file__).resolve().parent.parent
    work = Path(args.workdir or tempfile.mkdtemp(prefix="flake_budget_"))
    clone = work / "repo"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", args.rev], check=True)
    sha = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(clone)}
    print(f"clean clone of {sha} in {clone}; {args.runs} run(s) of {', '.join(tiers)}", flush=True)

    failed: Counter = Counter()
    for run in range(1, args.runs + 1):
        for tier in tiers:
            xml = work / f"run{run}-{tier}.xml"
            t0 = time.time()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                   f"--junitxml={xml}", *TIERS[tier]], cwd=clone, env=env,
                                  stdout=open(work / f"run{run}-{tier}.log", "w"), stderr=subprocess.STDOUT)
            wall = time.time() - t0
            outcomes = junit_outcomes(xml) if xml.exists() else {}
            counts = Counter(outcomes.values())
            bad = [t for t, o in outcomes.items() if o in ("failed", "error")]
            failed.update(bad)
            print(f"run {run} {tier:8s} exit {proc.returncode}  {counts['passed']} passed, "
                  f"{counts['failed']} failed, {counts['error']} errors, {counts['skipped']} skipped  "
                  f"{wall:7.0f} s  (log: {work / f'run{run}-{tier}.log'})", flush=True)
            if proc.returncode not in (0, 5) and not bad:  # 5: no tests collected
                failed[f"<pytest exit {proc.returncode} in run {run} {tier}: see its log>"] += 1
    if failed:
        print(f"\n{len(failed)} test(s) failed in at least one run:")
        for name, n in sorted(failed.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {n}/{args.runs}  {name}")
        return 1
    print(f"\nno test failed in {args.runs} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

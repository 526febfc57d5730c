"""benchmarks/chaos.py, shorter: 150 emulated RL steps with a rollout or reward worker
SIGKILLed about every 2 s (at random points and at dispatch, alternately).

Tier `chaos` (deselected by default): `pytest -m chaos tests/runtime/test_chaos.py`. The full
run (1000 steps, a kill about every 30 s) is `python benchmarks/chaos.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.chaos

ROOT = Path(__file__).resolve().parents[2]


def _report(report: Path, out: subprocess.CompletedProcess) -> dict:
    """The benchmark's JSON report; when it wrote none, fail with what it printed."""
    assert report.exists(), f"chaos.py wrote no report (exit {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}"
    return json.loads(report.read_text())


def test_chaos_short(tmp_path):
    # its own process: its own Ray, and the driver RSS measured is the benchmark's alone
    report = tmp_path / "chaos.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--steps", "150", "--ms", "2",
                          "--kill-every", "2", "--kill-at", "mixed", "--stall", "30", "--json", str(report)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         cwd=ROOT, timeout=600)
    r = _report(report, out)
    assert r["deadlock"] is None, r["deadlock"]
    assert r["steps_done"] == 150
    assert r["kills"] >= 2 and {k["at"] for k in r["kill_log"]} == {"random", "dispatch"}
    assert r["lost_units"] >= 1 and r["replacements"] >= 1  # a killed worker was noticed and replaced
    assert r["exactly_once"] and r["trained_twice"] == 0 and r["never_trained"] == 0
    assert r["rss_mb"]["flat"], r["rss_mb"]
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr[-2000:]


def test_chaos_preempt_short(tmp_path):
    # spot notices instead of SIGKILLs: half with no time left (killed), half honoured
    report = tmp_path / "chaos.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--preempt", "--steps", "150",
                          "--ms", "5", "--notice-every", "1", "--notice-s", "5", "--stall", "30",
                          "--json", str(report)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         cwd=ROOT, timeout=600)
    r = _report(report, out)
    assert r["deadlock"] is None, r["deadlock"]
    assert r["steps_done"] == 150
    sp = r["spot"]
    assert sp["notices"] >= 2 and sp["honoured"] + sp["killed"] + sp["pending"] == sp["notices"]
    assert sp["joins"] >= 1
    assert r["samples_lost"] == 0 and r["samples_duplicated"] == 0 and r["exactly_once"]
    assert out.returncode == 0 and "samples lost: 0, samples trained twice: 0" in out.stdout, \
        out.stdout + out.stderr[-2000:]

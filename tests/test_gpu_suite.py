"""benchmarks/gpu_suite.py: the owed GPU checks in one run. Without a GPU: the suite driver
runs checks in order, stops one at its budget (and what it started), keeps going, and rewrites
its JSON after every check; the slow tier runs the whole --dry-run (tiny variants on the CPU)."""

import importlib.util
import json
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers.gates import wait_until

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_suite.py"
spec = importlib.util.spec_from_file_location("gpu_suite", SCRIPT)
suite = sys.modules["gpu_suite"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(suite)


def _fake(name: str, code: str, budget: float = 60.0):
    return suite.Check(name, budget, lambda out, dry: [sys.executable, "-c", code], suite._last_json_line,
                       dry_budget_s=budget)


def test_checks_run_in_order_one_is_stopped_at_its_budget_and_the_json_says_so(tmp_path):
    checks = (
        _fake("first", "print('{\"figure\": 1.5}')"),
        # a check whose child process never ends: only the budget can stop it, with its process group
        _fake("stuck", "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; "
                       f"time.sleep(3600)']); open({str(tmp_path / 'child.pid')!r}, 'w').write(str(p.pid)); p.wait()",
              budget=2.0),
        _fake("failing", "import sys; print('{\"figure\": 2}'); sys.exit(3)"),
    )
    out = tmp_path / "suite.json"
    assert suite.main(["--dry-run", "--out", str(out)], checks=checks) == 1
    report = json.loads(out.read_text())
    got = [(c["name"], c["status"], c["returncode"], c["figures"]) for c in report["checks"]]
    assert got[0] == ("first", "pass", 0, {"figure": 1.5})
    assert got[1][:3] == ("stuck", "timeout", -9)
    child = tmp_path / "child.pid"
    if child.exists():  # it got as far as starting its child (on a loaded machine it may not have)
        pid = int(child.read_text())

        def gone() -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_until(gone, f"the stuck check's child {pid} to die with its process group", 30)
    assert got[2] == ("failing", "fail", 3, {"figure": 2})
    assert report["dry_run"] is True and report["budget_s"] == 122.0 and report["total_s"] > 0


def test_only_budget_and_refusals(tmp_path, capsys):
    checks = (_fake("a", "print(1)"), _fake("b", "print(2)"))
    out = tmp_path / "only.json"
    assert suite.main(["--dry-run", "--out", str(out), "--only", "b", "--budget", "b=5"], checks=checks) == 0
    report = json.loads(out.read_text())
    assert [c["name"] for c in report["checks"]] == ["b"] and report["checks"][0]["budget_s"] == 5.0
    for argv, message in ((["--only", "nope"], "unknown check"), (["--budget", "x"], "NAME=SECONDS")):
        with pytest.raises(SystemExit):
            suite.main(["--dry-run", "--out", str(out), *argv], checks=checks)
        assert message in capsys.readouterr().err


def test_the_owed_checks_in_order_within_ten_minutes():
    assert [c.name for c in suite.CHECKS] == ["gpu_check", "profile_sd3", "profile_flux", "pytest_gpu",
                                              "gpu_gang_check", "gpu_load_check", "gpu_relay_check"]
    assert suite.BUDGET_S <= 10 * 60  # the suite's device time (issue 40)


@pytest.mark.slow
def test_dry_run_of_every_check(tmp_path):
    out = tmp_path / "dry.json"
    code = suite.main(["--dry-run", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [c["name"] for c in report["checks"]] == [c.name for c in suite.CHECKS]
    assert code == 0, [(c["name"], c["status"], c["log_tail"][-500:]) for c in report["checks"]]
    figures = {c["name"]: c["figures"] for c in report["checks"]}
    assert figures["gpu_check"] and figures["profile_sd3"] and figures["profile_flux"]
    assert figures["pytest_gpu"]["tests"] > 0 and figures["gpu_gang_check"]["models"]
    assert {(r["gang"], r["train"], r["loader"]) for r in figures["gpu_load_check"]["rows"]} == {
        (g, t, loader) for g in (1, 2, 4) for t in ("full", "lora") for loader in ("whole", "sharded")}
    assert figures["gpu_relay_check"]["receivers"] == 1 and figures["gpu_relay_check"]["step_ms_publish"] > 0

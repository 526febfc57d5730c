"""Smoke test of benchmarks/gpu_check.py with tiny configs on CPU (the real run needs a GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("diffusers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def test_gpu_check_tiny_runs_and_reports(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    out = tmp_path / "gpu_check.json"
    rc = gpu_check.main(["--tiny", "--models", "sd3,flux", "--json", str(out), "--warmup", "0", "--iters", "1"])
    rows = json.loads(out.read_text())
    assert rc == 0, rows
    assert [r["model"] for r in rows] == ["sd3-tiny", "flux-tiny"]
    for r in rows:
        assert r["ratio_exact"] is True and r["logp_max_abs_diff"] == 0.0
        for key in ("bare_fwd_ms", "adapter_rollout_ms", "bare_fwd_bwd_ms", "adapter_train_ms"):
            assert r[key] > 0
    assert "ratio==1" in capsys.readouterr().out

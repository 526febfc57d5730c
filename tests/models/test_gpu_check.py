"""benchmarks/gpu_check.py: a tiny-config smoke test in the CPU suite, and the check itself
on CUDA (`pytest -m gpu`, skipped without a GPU): ratio == 1 in bf16 and overhead timings."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_gpu_check_tiny_runs_and_reports(tmp_path, capsys):
    gpu_check = _load_gpu_check()
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


def _check_on_cuda(rows: list[dict], models: list[str]) -> None:
    assert [r["model"] for r in rows] == models, rows
    for r in rows:
        assert r["device"] == torch.cuda.get_device_name(0) and r["dtype"] == "bfloat16", r
        # the rollout's no-grad logp and the trainer's recomputation agree bit for bit in bf16
        assert r["ratio_exact"] is True and r["logp_max_abs_diff"] == 0.0, r
        assert r["peak_GB"] > 0
        for key in ("bare_fwd_ms", "adapter_rollout_ms", "bare_fwd_bwd_ms", "adapter_train_ms"):
            assert r[key] > 0


@pytest.mark.gpu
@needs_cuda
def test_gpu_check_tiny_configs_on_cuda(tmp_path):
    out = tmp_path / "gpu_check.json"
    rc = _load_gpu_check().main(["--tiny", "--models", "sd3,flux", "--json", str(out), "--warmup", "1",
                                 "--iters", "2"])
    rows = json.loads(out.read_text())
    assert rc == 0, rows
    _check_on_cuda(rows, ["sd3-tiny", "flux-tiny"])


@pytest.mark.gpu
@needs_cuda
def test_gpu_check_sd35_medium_on_cuda(tmp_path):
    # the real architecture (2.2B parameters, 512x512, random weights: nothing is downloaded);
    # about 12 GiB at batch 1 without an optimizer step (docs/guides/models.md), any 24 GB GPU
    out = tmp_path / "gpu_check.json"
    rc = _load_gpu_check().main(["--models", "sd3", "--json", str(out), "--warmup", "2", "--iters", "3"])
    rows = json.loads(out.read_text())
    assert rc == 0, rows
    _check_on_cuda(rows, ["sd3"])
    assert 2.0 < rows[0]["params_B"] < 2.5 and rows[0]["latent_shape"] == [16, 64, 64]

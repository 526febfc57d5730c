"""benchmarks/gpu_gang_check.py --tiny: the GPU gang check's code path on CPU under gloo.

Runs the script as a subprocess (it owns a process group) and checks its one JSON line:
the byte counts that follow from the layout exactly (fp32 master weights and gradients,
AdamW's two fp32 moments), positive copy rates, a peak no smaller than what stays resident.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_gang_check.py"
GIB = 2.0**30


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def _report(*args: str) -> dict:
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected ONE JSON line on stdout, got {len(lines)}: {proc.stdout[:500]}"
    return json.loads(lines[0])


def _check_row(row: dict, lora: bool) -> None:
    assert "error" not in row, row.get("error")
    m, relay = row["measured"], row["relay"]
    assert row["train"] == ("lora" if lora else "full")
    # the training ran: finite losses, every trainable tensor got a gradient through FSDP's hooks
    assert len(m["losses"]) == 2 and all(math.isfinite(x) for x in m["losses"])
    assert m["trainable_without_grad"] == 0
    # exact bytes of the layout at world size 1 (the local shard is the whole tensor):
    # fp32 master weights 4 B/param, fp32 gradients 4 B per trainable param (reduce dtype),
    # AdamW exp_avg + exp_avg_sq 8 B per trainable param plus a 4-byte step per tensor
    tp, n = m["trainable_params"], m["trainable_tensors"]
    assert (tp < m["params"]) == lora
    assert m["resident_GiB"]["weights"] * GIB == pytest.approx(4 * m["params"])
    assert m["grads_GiB"] * GIB == pytest.approx(4 * tp)
    assert 8 * tp <= m["resident_GiB"]["optimizer"] * GIB <= 8 * tp + 8 * n
    # the peak holds at least the resident weights and optimizer state
    resident = m["resident_GiB"]["weights"] + m["resident_GiB"]["optimizer"]
    assert m["peak_GiB"] >= resident > 0
    # the relay payload: bf16 copies of the adapters (LoRA) or of every weight
    assert relay["payload"] == ("adapters" if lora else "full")
    assert relay["payload_GB"] * 1e9 == (2 * tp if lora else 2 * m["params"])
    assert relay["buckets"] >= 1
    for key in ("pack_GBps", "d2d_GBps", "d2h_GBps"):
        assert relay[key] > 0, key


@pytest.mark.slow  # the default tier keeps the LoRA case
def test_tiny_full_finetune_after_forward():
    out = _report("--tiny", "--models", "tiny-dit,flux", "--no-sp")
    assert out["backend"] == "gloo" and out["world_size"] == 1 and out["device"] == "cpu"
    rows = {r["model"]: r for r in out["models"]}
    assert set(rows) == {"tiny-dit", "flux"}
    for row in rows.values():
        _check_row(row, lora=False)
        assert row["reshard_after_forward"] is True
        assert row["predicted"] is None  # the memory model has no tiny entries; the script says so
    assert rows["tiny-dit"]["fsdp_units"] == 4 + 1  # TinyDiTConfig depth 4 blocks + the root
    assert rows["flux"]["fsdp_units"] == 1 + 1 + 1  # 1 double-stream + 1 single-stream block + the root


def test_tiny_lora_after_step_small_buckets():
    # 64 KiB buckets: the adapters (~0.25 MB bf16) split over several
    # (FLUX.1 is the model --train auto puts on LoRA on one H200)
    out = _report("--tiny", "--models", "tiny-dit,flux", "--train", "lora", "--reshard", "after-step",
                  "--bucket-mib", "0.0625", "--no-sp")
    rows = {r["model"]: r for r in out["models"]}
    for row in rows.values():
        _check_row(row, lora=True)
        assert row["reshard_after_forward"] is False
    relay = rows["tiny-dit"]["relay"]
    assert relay["buckets"] >= relay["payload_GB"] * 1e9 / 65536 > 1


@pytest.mark.slow
def test_tiny_sequence_parallel_case():
    """The sequence-parallel case on a tiny Wan: the degree-1 processors change nothing, 2 gloo
    ranks give the one-process output, and they count the bytes the simulator predicts."""
    out = _report("--tiny", "--models", "tiny-dit")
    sp = out["sequence_parallel"]
    assert "error" not in sp, sp.get("error")
    one = sp["degree1"]
    assert one["max_abs_diff"] == 0.0 and one["diffusers_ms"] > 0 and one["sp_degree1_ms"] > 0
    assert one["tokens"] % 2  # an odd token count: the split pads
    two = sp["degreeN"]
    assert two["degree"] == 2 and two["max_abs_diff"] < 1e-5
    assert two["counted"]["comm/train/all_to_all_bytes"] > 0
    assert two["bytes_match"], (two["counted"], two.get("predicted"), two.get("predicted_error"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU refusal")
def test_refuses_without_gpu():
    proc = _run("--models", "sd3")
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--tiny" in proc.stderr
    assert proc.stdout.strip() == ""


def test_auto_mode_follows_the_memory_model():
    """--train auto on the real models: SD3.5-medium trains fully, FLUX.1 (16 B/param ~ 177 GiB) uses LoRA."""
    spec = importlib.util.spec_from_file_location("gpu_gang_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    table = check.fit_table(check.load_calibration())
    assert check.full_fits(table, "sd3.5-medium", True, 1)
    assert not check.full_fits(table, "flux.1-12b", True, 1)
    full = check.predict(table, "flux.1-12b", False, True, 1)
    # full fine-tune, world size 1: 16 B/param of resident state plus activations
    assert full["weights_GiB"] + full["grads_GiB"] + full["optimizer_GiB"] == pytest.approx(16 * 11.901e9 / GIB)
    assert full["train_peak_GiB"] > full["usable_GiB"] and not full["fits_h200"]
    lora = check.predict(table, "flux.1-12b", True, True, 1)
    assert lora["fits_h200"] and lora["trainable_params"] > 0 and lora["note"]

"""`digenrl profile` on CPU: tiny-dit and a tiny SD3 write calibration lines CostModel loads;
`profile_run` measures the run at hand through the project's own sampler and learner."""

from __future__ import annotations

import json

import pytest
import torch

from digenrl.config.schema import Config, load_config
from digenrl.learner import Learner
from digenrl.models import build_policy
from digenrl.profile import PeakMemory, merge_records, profile_main, profile_run
from digenrl.train.trainer import learner_config
from digenrl.rollout import sampler
from digenrl.sim.calibration import load_calibration
from digenrl.sim.costs import CostModel
from digenrl.train.trainer import Trainer

# the keys of a model line in digenrl/sim/calibration/h200.jsonl
MODEL_KEYS = {"model", "params_B", "tokens", "shape", "what", "batch", "ms", "device"}
FAST = ["--device", "cpu", "--warmup", "0", "--iters", "1"]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_merge_replaces_measured_model_and_what():
    base = [{"model": "a", "what": "forward", "batch": 1, "ms": 1.0},
            {"model": "a", "what": "forward", "batch": 2, "ms": 2.0},
            {"model": "a", "what": "fwd+bwd", "batch": 1, "ms": 3.0},
            {"what": "pcie", "h2d_GBps": 1.0}]
    new = [{"model": "a", "what": "forward", "batch": 4, "ms": 9.0}, {"what": "pcie", "h2d_GBps": 2.0}]
    out = merge_records(base, new)
    # both old forward lines go (one device per fit), fwd+bwd stays, pcie is replaced
    assert [(r.get("model"), r["what"], r.get("batch")) for r in out] == [
        ("a", "fwd+bwd", 1), ("a", "forward", 4), (None, "pcie", None)]


def test_profile_tiny_dit(tmp_path):
    out = tmp_path / "cpu.jsonl"
    rc = profile_main(["--model", "tiny-dit", *FAST, "--batches", "1,2", "--train-batches", "1",
                       "--what", "forward,train,adamw,pcie", "--out", str(out)])
    assert rc == 0
    lines = _lines(out)
    models = [r for r in lines if r.get("model") == "tiny-dit"]
    assert [(r["what"], r["batch"]) for r in models] == [
        ("forward", 1), ("forward", 2), ("fwd+bwd", 1), ("fwd+bwd", 1)]
    for r in models:
        assert MODEL_KEYS <= set(r) and r["ms"] > 0 and r["tokens"] == 8 * 8 + 8
    # the tiny DiT checkpoints its blocks (model.grad_ckpt): measured without and with
    assert [r["grad_ckpt"] for r in models if r["what"] == "fwd+bwd"] == [False, True]
    adamw = [r for r in lines if r["what"].startswith("adamw")]
    assert len(adamw) == 1 and adamw[0]["ms_per_B_params"] > 0
    assert not [r for r in lines if r["what"] == "pcie"]  # CUDA only

    # a second run into the same file replaces what it measured, keeps the rest
    profile_main(["--model", "tiny-dit", *FAST, "--what", "adamw", "--out", str(out)])
    again = _lines(out)
    assert len(again) == len(lines) and sum(r["what"].startswith("adamw") for r in again) == 1


@pytest.mark.slow  # a diffusers family end to end; the default tier profiles the tiny DiT
def test_profile_tiny_sd3_loads_into_cost_model(tmp_path):
    pytest.importorskip("diffusers")
    out = tmp_path / "sd3.jsonl"
    # named as the cost model's SD3.5 entry so its fit is built from these lines; completed
    # from the packaged H200 file (VAEs, T5, AdamW) so CostModel can load it
    rc = profile_main(["--arch", "sd3", "--random", "--tiny", *FAST, "--name", "sd3.5-medium",
                       "--batches", "1,2", "--train-batches", "1,2", "--decode-batches", "1",
                       "--what", "forward,train,vae,lora", "--lora-rank", "4", "--fill-from-h200", "--out", str(out)])
    assert rc == 0
    lines = _lines(out)
    ours = [r for r in lines if r.get("model") == "sd3.5-medium"]
    assert {(r["what"], r.get("grad_ckpt"), r["batch"]) for r in ours} == {
        ("forward", None, 1), ("forward", None, 2),
        ("fwd+bwd", False, 1), ("fwd+bwd", False, 2), ("fwd+bwd", True, 1), ("fwd+bwd", True, 2),
        ("fwd+bwd-frozen-base", False, 1), ("fwd+bwd-frozen-base", False, 2),
        ("fwd+bwd-frozen-base", True, 1), ("fwd+bwd-frozen-base", True, 2)}
    assert all(r["device"] == "cpu" and r["tokens"] == 16 + 16 for r in ours)  # 8x8 latent in 2x2 patches + text
    assert [r["what"] for r in lines if r.get("model") == "sd3.5-medium-vae"] == ["decode-64px"]
    # every H200 line not measured here survives
    h200 = load_calibration()
    assert len(lines) == len([r for r in h200 if r.get("model") != "sd3.5-medium"]) + len(ours) + 1

    if not PeakMemory(torch.device("cpu")).cpu_resettable:
        pytest.skip("no resettable RSS peak here (/proc/self/clear_refs): CostModel needs peak_GB to fit memory")
    cm = CostModel(calibration=out)
    fwd = {b: ms for b, ms in cm.table["sd3.5-medium", "forward"].points}
    assert fwd == {r["batch"]: pytest.approx(r["ms"] * 1e-3) for r in ours if r["what"] == "forward"}
    assert {("sd3.5-medium", op) for op in ("train", "train_ckpt", "lora_train", "lora_train_ckpt")} <= set(cm.table)
    assert float(cm.denoise_s("sd3.5-medium", "H200", 1)) > 0


def test_profile_rejects_random_without_config(capsys):
    with pytest.raises(SystemExit):
        profile_main(["--arch", "wan", "--random", "--tiny", *FAST, "--what", "forward"])


def _counting(monkeypatch, owner, name):
    """Replace owner.name by a wrapper that still runs it and records, per call, torch's thread count."""
    calls = []
    real = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return calls


def test_cli_times_the_sampler_step_and_learner_accumulate(tmp_path, monkeypatch):
    steps = _counting(monkeypatch, sampler, "denoise_step")
    units = _counting(monkeypatch, Learner, "accumulate")
    out = tmp_path / "cpu.jsonl"
    profile_main(["--model", "tiny-dit", *FAST, "--batches", "1,2", "--train-batches", "1,2,4",
                  "--what", "forward,train", "--out", str(out)])
    # forward: per batch, one step to build the micro-batch + one timed; train: per batch and
    # per grad_ckpt setting (the tiny DiT has both), one step to record the behaviour
    # log-prob, then one timed accumulate
    assert len(steps) == 2 * 2 + 3 * 2 and len(units) == 3 * 2
    assert [(r["what"], r["batch"]) for r in _lines(out)] == [
        ("forward", 1), ("forward", 2)] + [("fwd+bwd", b) for b in (1, 2, 4)] * 2


def test_profile_run_default_config_measures_every_cost():
    cfg = Config()  # tiny-dit, LoRA rank 16, toy-geneval reward
    lines = profile_run(cfg)
    assert {r["what"] for r in lines} == {"forward", "fwd+bwd-frozen-base", "reward", "optimizer", "weights"}
    for what in ("forward", "fwd+bwd-frozen-base", "reward"):
        assert [r["batch"] for r in lines if r["what"] == what] == [1, 2, 4, 8], what
    for what in ("optimizer", "weights"):  # one each: neither depends on the batch
        assert [r["batch"] for r in lines if r["what"] == what] == [None], what
    for r in lines:
        assert r["model"] == "tiny-dit" and r["device"] == "cpu" and r["threads"] == cfg.runtime.worker_threads
        assert r["ms"] > 0 and r["tokens"] == 8 * 8 + 8
    for what in ("forward", "fwd+bwd-frozen-base"):
        ms = {r["batch"]: r["ms"] for r in lines if r["what"] == what}
        assert ms[8] > ms[1], (what, ms)  # 8x the work; loose enough for a shared machine
    # the weight payload is the LoRA adapters: rank 16 on every targeted Linear, fp32
    lora = [p for n, p in build_policy(cfg.model, progress=False).module.named_parameters() if "lora_" in n]
    (weights,) = [r for r in lines if r["what"] == "weights"]
    assert lora and weights["bytes"] == sum(p.numel() * 4 for p in lora)


def test_profile_run_full_fine_tune_goes_through_learner_accumulate(monkeypatch):
    cfg = Config()
    cfg.model.lora_rank = 0
    assert cfg.runtime.worker_threads == 1
    units = _counting(monkeypatch, Learner, "accumulate")
    steps_taken = _counting(monkeypatch, Learner, "optimizer_step")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)  # the caller's setting, which the measurement must not keep
    try:
        lines = profile_run(cfg, batches=(1, 2), repeats=2)
        threads_after = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads_before)
    assert len(units) == 2 * (1 + 2)  # per batch: one warmup + two repeats, nothing else
    assert len(steps_taken) == 1 + 2
    assert set(units + steps_taken) == {1}  # measured on the worker's threads ...
    assert threads_after == 2  # ... and the caller's restored after
    train = [r for r in lines if r["what"].startswith("fwd+bwd")]
    assert [(r["what"], r["batch"], r["grad_ckpt"]) for r in train] == [("fwd+bwd", 1, False), ("fwd+bwd", 2, False)]
    (weights,) = [r for r in lines if r["what"] == "weights"]
    assert weights["bytes"] == round(weights["params_B"] * 1e9) * 4  # full fine-tune: every fp32 weight


def test_profile_run_uses_the_trainers_learner_config(tmp_path):
    overrides = [f"run.run_dir={tmp_path}", "train.lr=3e-4", "train.weight_decay=0.01", "train.clip_range=2e-4",
                 "train.beta=0.01", "train.max_grad_norm=0.5", "train.ema_decay=0.9", "train.backward_batch=2",
                 "train.loss=grpo-guard"]
    cfg = load_config(None, overrides)
    assert learner_config(cfg) == Trainer(cfg, progress=False).learner.config

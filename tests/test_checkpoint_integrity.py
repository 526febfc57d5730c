"""Checkpoints carry a manifest (size and sha256 of every file); a damaged or truncated one
is refused, naming the file, and --resume falls back to the one before it."""

import json
import logging

import pytest

from digenrl.io import checkpoint as ckpt
from digenrl.config.schema import load_config
from digenrl.io.runs import RunError, resolve_snapshot
from digenrl.train.trainer import Trainer


def _run(run_dir, steps):
    cfg = load_config(None, [f"run.run_dir={run_dir}", "run.mode=local", "run.loggers=[]", f"train.steps={steps}",
                             "run.eval_every=0", "run.checkpoint_every=1", "run.keep_checkpoints=3",
                             "data.groups_per_step=2", "data.group_size=2", "data.micro_batch_groups=1",
                             "data.eval_max_prompts=1", "data.eval_samples=1",
                             "sampling.num_steps=3", "sampling.eval_num_steps=2"])
    trainer = Trainer(cfg, progress=False)
    return trainer, cfg


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    trainer, _ = _run(run_dir, 2)
    trainer.train()
    return run_dir


def _copy(run, tmp_path):
    import shutil

    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_manifest_lists_every_file_with_size_and_sha256(run):
    step = ckpt.latest_checkpoint(run)
    assert step.name == "step_000002"
    files = json.loads((step / ckpt.MANIFEST).read_text())["files"]
    assert set(files) == {"policy.safetensors", "optimizer.safetensors"}
    for name, entry in files.items():
        assert entry["bytes"] == (step / name).stat().st_size and len(entry["sha256"]) == 64
    ckpt.verify_checkpoint(step)


@pytest.mark.parametrize("damage,words", [
    ("truncate", "bytes, the manifest says"),
    ("flip", "does not match its sha256"),
    ("remove", "is missing"),
])
def test_a_damaged_checkpoint_is_refused_and_resume_takes_the_one_before(run, tmp_path, caplog, damage, words):
    run_dir = _copy(run, tmp_path)
    newest = run_dir / "checkpoints" / "step_000002" / "policy.safetensors"
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        newest.unlink()
    with pytest.raises(ckpt.CheckpointError, match=words):
        ckpt.verify_checkpoint(newest.parent)
    with caplog.at_level(logging.WARNING, logger="digenrl.io.checkpoint"):
        assert ckpt.latest_checkpoint(run_dir).name == "step_000001"
    assert "policy.safetensors" in caplog.text and "trying step_000001" in caplog.text
    assert ckpt.latest_checkpoint(run_dir, verify=False).name == "step_000002"
    with pytest.raises(RunError, match=words):  # digenrl sample / eval --step 2
        resolve_snapshot(run_dir, "2")
    # --resume continues from step 1: step 2 is redone (its checkpoint rewritten whole), then 3
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    step1 = next(line for line in lines if json.loads(line)["step"] == 1)
    trainer, _ = _run(run_dir, 3)
    trainer.train(resume=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert step1 in lines  # kept, not redone: the run resumed from step 1, not from scratch
    steps = [json.loads(line)["step"] for line in lines]
    assert [s for s in steps if s > 0] == [1, 2, 3]
    ckpt.verify_checkpoint(newest.parent)


def test_a_checkpoint_without_a_manifest_still_loads(run, tmp_path, caplog):
    run_dir = _copy(run, tmp_path)
    (run_dir / "checkpoints" / "step_000002" / ckpt.MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="digenrl.io.checkpoint"):
        assert ckpt.latest_checkpoint(run_dir).name == "step_000002"
    assert "not verified" in caplog.text

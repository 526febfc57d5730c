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


def test_manifest_lists_every_file_with_size_and_hash(run):
    step = ckpt.latest_checkpoint(run)
    assert step.name == "step_000002"
    files = json.loads((step / ckpt.MANIFEST).read_text())["files"]
    assert set(files) == {"policy.safetensors", "optimizer.safetensors"}
    for name, entry in files.items():
        assert entry["bytes"] == (step / name).stat().st_size and len(entry["xxh3_128"]) == 32
    ckpt.verify_checkpoint(step)


@pytest.mark.parametrize("damage,words", [
    ("truncate", "bytes, the manifest says"),
    ("flip", "does not match its xxh3_128"),
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


# -- hashed while written (digenrl.io.integrity) ---------------------------------------
def _xxh3(path):
    """The reference: xxh3-128 of the file's bytes as read back from disk."""
    import xxhash

    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


def test_safetensors_hashed_from_memory_is_the_hash_of_the_file(tmp_path):
    import torch
    from safetensors.torch import load_file

    from digenrl.io.integrity import Digests

    g = torch.Generator().manual_seed(0)
    tensors = {  # dtypes of 1, 2, 4, 8 bytes, a 0-d and an empty tensor, a non-contiguous view
        "w": torch.randn(5, 7, generator=g), "b": torch.randn(3, generator=g).bfloat16(),
        "step": torch.tensor(3.0), "mask": torch.tensor([True, False, True]), "ids": torch.arange(4),
        "empty": torch.zeros(0, 2), "t": torch.randn(4, 6, generator=g).t(),
    }
    digests = Digests(tmp_path)
    digests.save_safetensors(tensors, tmp_path / "a.safetensors", metadata={"param_groups": "[]"})
    entry = digests.files["a.safetensors"]
    assert entry == {"bytes": (tmp_path / "a.safetensors").stat().st_size, "xxh3_128": _xxh3(tmp_path / "a.safetensors")}
    back = load_file(str(tmp_path / "a.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


def _sharded_run(run_dir, steps=(1, 2)):
    """A one-process sharded (dcp/) checkpoint of a tiny policy after each of `steps`."""
    import torch

    from digenrl.learner import Learner
    from tests.learner.tiny_setup import CONFIG, tiny_policy

    policy = tiny_policy(1, 0)
    learner = Learner(policy, CONFIG)
    for step in steps:
        for p in learner.params:
            p.grad = torch.full_like(p, float(step))
        learner.optimizer_step()
        ckpt.save_sharded_checkpoint(run_dir, step, module=policy.module, optimizer=learner.optimizer,
                                     ema=learner.ema, state={"step": step}, keep=3)
    return run_dir / "checkpoints" / f"step_{steps[-1]:06d}"


def test_dcp_shards_are_hashed_while_written_and_a_damaged_shard_is_refused(tmp_path, caplog):
    step = _sharded_run(tmp_path / "run")
    tree = json.loads((step / ckpt.MANIFEST).read_text())
    assert (tree["format"], tree["hash"]) == (2, "xxh3_128")
    on_disk = sorted(p.relative_to(step).as_posix() for p in (step / "dcp").iterdir())
    assert sorted(tree["files"]) == on_disk and "dcp/optimizer.json" in on_disk and len(on_disk) == 2
    for rel, entry in tree["files"].items():  # what the writer hashed is what is on disk
        assert entry == {"bytes": (step / rel).stat().st_size, "xxh3_128": _xxh3(step / rel)}, rel
    shard = next(step.glob("dcp/shard-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit in the middle of the tensor data, size unchanged
    shard.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match=rf"dcp/{shard.name} does not match its xxh3_128"):
        ckpt.verify_checkpoint(step)
    with caplog.at_level(logging.WARNING, logger="digenrl.io.checkpoint"):
        assert ckpt.latest_checkpoint(tmp_path / "run").name == "step_000001"
    assert shard.name in caplog.text


def test_a_manifest_of_the_older_sha256_format_still_verifies(tmp_path):
    # format 1, as checkpoints written before xxh3 carry it: {"files": {rel: {"bytes", "sha256"}}}
    import hashlib

    step = _sharded_run(tmp_path / "run", steps=(1,))
    files = {p.relative_to(step).as_posix(): {"bytes": p.stat().st_size,
                                              "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted((step / "dcp").iterdir())}
    (step / ckpt.MANIFEST).write_text(json.dumps({"files": files}))
    ckpt.verify_checkpoint(step)
    groups = step / "dcp" / "optimizer.json"
    groups.write_text(groups.read_text().replace("0", "1", 1))  # same size, other bytes
    with pytest.raises(ckpt.CheckpointError, match="dcp/optimizer.json does not match its sha256"):
        ckpt.verify_checkpoint(step)
    files["dcp/optimizer.json"] = {"bytes": groups.stat().st_size, "md5": "0" * 32}
    (step / ckpt.MANIFEST).write_text(json.dumps({"files": files}))
    with pytest.raises(ckpt.CheckpointError, match="names no hash this version checks"):
        ckpt.verify_checkpoint(step)


def test_parallel_verify_names_the_first_damaged_file_and_counts_the_rest(tmp_path):
    from digenrl.io.integrity import Digests, manifest, verify

    digests = Digests(tmp_path)
    for i in range(6):
        digests.write_bytes(tmp_path / f"f{i}.bin", bytes([i]) * (1000 + i))
    tree = manifest(digests.files)
    verify(tmp_path, tree, threads=4)
    for i in (4, 1, 3):
        (tmp_path / f"f{i}.bin").write_bytes(bytes([i + 1]) * (1000 + i))
    with pytest.raises(ckpt.CheckpointError, match=r"f1.bin does not match its xxh3_128 .* \(and 2 more files\)"):
        verify(tmp_path, tree, threads=4)


def test_a_file_the_writers_did_not_hash_stops_the_commit(tmp_path):
    # a save path that bypassed Digests would otherwise commit a file nobody can check
    from digenrl.io.integrity import Digests

    tmp = tmp_path / "checkpoints" / ".tmp_step_000001"
    tmp.mkdir(parents=True)
    digests = Digests(tmp)
    digests.write_bytes(tmp / "hashed.bin", b"abc")
    (tmp / "stray.bin").write_bytes(b"xyz")
    with pytest.raises(RuntimeError, match=r"written without a hash: \['stray.bin'\]"):
        ckpt._commit(tmp_path, tmp, tmp_path / "checkpoints" / "step_000001", {"step": 1}, 2, digests.files)
    (tmp / "stray.bin").unlink()
    (tmp / "hashed.bin").write_bytes(b"abcd")  # changed after it was written
    with pytest.raises(RuntimeError, match="hashed.bin has 4 bytes on disk, 3 were written"):
        ckpt._commit(tmp_path, tmp, tmp_path / "checkpoints" / "step_000001", {"step": 1}, 2, digests.files)

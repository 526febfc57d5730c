"""run.loggers: an offline wandb run holds what metrics.jsonl holds; config refusals name the key."""

import glob
import json
import struct

import pytest

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.train.trainer import Trainer

TINY = ["run.mode=local", "data.groups_per_step=2", "data.group_size=2", "data.micro_batch_groups=2",
        "data.eval_max_prompts=1", "data.eval_samples=1", "sampling.num_steps=3", "sampling.eval_num_steps=3",
        "reward.threads=1", "train.steps=2", "run.checkpoint_every=0", "run.eval_every=1"]


def wandb_records(path):
    """Protobuf records of a .wandb file: wandb writes them in LevelDB's log format (7-byte
    file header, 32 KiB blocks, each chunk a 7-byte header of crc32, length, type: 1 full,
    2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is zero padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def wandb_history(run_dir):
    files = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    rows = []
    for r in wandb_records(files[0]):
        if r.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows, files[0]


def test_offline_wandb_run_holds_the_step_metrics_and_eval_grids(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the test extra installs wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    cfg = load_config(None, TINY + [f"run.run_dir={run_dir}", "run.loggers=[wandb]", "run.wandb_mode=offline",
                                    "run.wandb_project=digenrl-test"])
    Trainer(cfg, progress=False).train()
    assert not (run_dir / "tensorboard").exists()  # tensorboard is not in run.loggers
    history, wandb_file = wandb_history(run_dir)
    by_step = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    metrics = read_metrics(run_dir)
    assert sorted(by_step) == [r["step"] for r in metrics] == [0, 1, 2]
    for r in metrics:
        row = by_step[r["step"]]
        for k in ("reward_mean", "loss", "clipfrac"):
            if k in r:
                assert row[f"step/{k}"] == pytest.approx(r[k])
        assert row["eval/reward_mean"] == pytest.approx(r["eval/reward_mean"])
        assert row["eval/samples/_type"] == "image-file"  # the Evaluator's grid of that step
        media = run_dir / "wandb" / wandb_file.split("/")[-2] / "files" / row["eval/samples/path"]
        assert media.exists()
    assert "step/reward_mean" not in by_step[0]  # the step-0 record is the base evaluation only


def test_default_is_tensorboard_and_the_old_switch_still_works():
    assert load_config(None, []).run.loggers == ["tensorboard"]
    off = load_config(None, ["run.tensorboard=false"]).run
    assert off.loggers == [] and off.tensorboard is None  # folded into run.loggers
    both = load_config(None, ["run.loggers=[tensorboard,wandb]", "run.tensorboard=false"]).run
    assert both.loggers == ["wandb"]


def test_tensorboard_logger_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    cfg = load_config(None, TINY + [f"run.run_dir={tmp_path / 'run'}", "train.steps=1", "run.eval_every=0"])
    Trainer(cfg, progress=False).train()
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.parametrize("overrides, key", [
    (["run.loggers=[mlflow]"], "run.loggers"),
    (["run.loggers=[wandb,wandb]"], "run.loggers"),
    (["run.wandb_mode=offline"], "run.wandb_mode"),  # no wandb in run.loggers
    (["run.wandb_project=mine"], "run.wandb_project"),
    (["run.loggers=[wandb]", "run.wandb_mode=sometimes"], "run.wandb_mode"),
    (["run.loggers=[wandb]", "run.tensorboard=true"], "run.tensorboard"),
])
def test_logger_keys_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"^{key}:"):
        load_config(None, overrides)


def test_missing_wandb_is_refused_before_work_naming_the_extra(tmp_path, monkeypatch, capsys):
    import importlib.util

    import digenrl.train.trainer
    from digenrl.tools.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))

    def refuse(*args, **kwargs):
        raise AssertionError("a trainer was built: work started")

    monkeypatch.setattr(digenrl.train.trainer, "Trainer", refuse)
    assert main(["train", "--run-dir", str(tmp_path), "run.mode=local", "run.loggers=[wandb]"]) == 2
    err = capsys.readouterr().err
    assert "run.loggers" in err and "digenrl[wandb]" in err

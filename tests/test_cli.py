"""The `digenrl` command line: errors before work, delegated subcommands get their argv."""

import json
import shlex
from pathlib import Path

import pytest

from digenrl.tools.cli import main


def test_bad_config_exits_2_naming_the_key(capsys):
    assert main(["train", "data.group_size=1"]) == 2
    assert "data.group_size" in capsys.readouterr().err


def test_simulate_receives_its_own_options(capsys):
    assert main(["simulate", "--testbed", "small-h200x16-sd35", "--steps", "6", "--modes", "colocated-ideal,digenrl"]) == 0
    out = capsys.readouterr().out
    assert "digenrl" in out and "colocated" in out


def test_local_train_end_to_end(tmp_path, capsys):
    code = main(["train", "--steps", "1", "--run-dir", str(tmp_path), "--quiet", "run.mode=local",
                 "run.tensorboard=false", "data.groups_per_step=2", "data.group_size=2",
                 "data.micro_batch_groups=1", "data.eval_max_prompts=2", "data.eval_samples=1",
                 "sampling.num_steps=3", "sampling.eval_num_steps=3"])
    assert code == 0
    out = capsys.readouterr().out
    assert "held-out eval reward" in out and (tmp_path / "final" / "policy.safetensors").exists()


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a trainer (local or Ray) is ever constructed."""
    import digenrl.runtime.driver
    import digenrl.train.trainer

    def refuse(*args, **kwargs):
        raise AssertionError("bad input reached a trainer: work started")

    monkeypatch.setattr(digenrl.train.trainer, "Trainer", refuse)
    monkeypatch.setattr(digenrl.runtime.driver, "RayDriver", refuse)


@pytest.mark.parametrize("argv, key", [
    (["model.name=flux", "model.path=/nonexistent"], "model.path"),
    (["model.path=./no_such_tiny_dit.safetensors"], "model.path"),
    (["data.prompts=/no/prompts.txt", "reward.weights={jpeg-compressibility: 1.0}"], "data.prompts"),
    (["reward.weights={pickscore: 1.0}", "reward.paths.pickscore=/no/PickScore_v1"], "reward.paths.pickscore"),
    (["reward.weights={pickscore: 1.0}"], "reward.paths.pickscore"),
    (["runtime.compute=emulated", "runtime.testbed=no-such-testbed"], "runtime.testbed"),
    (["model.device=cuda"], "runtime.rollout.num_gpus"),
    (["run.threads=2"], "run.threads"),
])
def test_bad_input_prints_only_the_message_and_exits_2_before_work(argv, key, no_work, capsys):
    import ray

    from tests.helpers.ray_cluster import leave_shared_ray_cluster

    leave_shared_ray_cluster()  # an earlier module's cluster (same process) would hide a start here
    assert main(["train", *argv]) == 2
    out = capsys.readouterr()
    assert out.err.startswith("digenrl train: invalid configuration: ") and key in out.err
    assert "Traceback" not in out.err + out.out and out.out == ""  # not even the start line
    assert not ray.is_initialized()


class Stop(Exception):
    """Raised by the recording trainer: the config was built, no work was done."""


def _capture_config(monkeypatch):
    """Replace the local trainer with one that records its config and stops."""
    import digenrl.train.trainer

    seen = []

    def record(cfg, progress=True):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(digenrl.train.trainer, "Trainer", record)
    return seen


def test_overrides_may_follow_options(tmp_path, monkeypatch):
    seen = _capture_config(monkeypatch)
    with pytest.raises(Stop):
        main(["train", "--steps", "2", "model.lora_rank=0", "--run-dir", str(tmp_path), "run.mode=local",
              "--seed", "7", "train.lr=1e-4", "--quiet"])
    cfg = seen[0]
    assert (cfg.train.steps, cfg.model.lora_rank, cfg.run.run_dir, cfg.run.mode) == (2, 0, str(tmp_path), "local")
    assert (cfg.run.seed, cfg.train.lr) == (7, 1e-4)


def test_train_help_and_unknown_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0 and "key=value" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["train", "--no-such-option", "run.mode=local"])
    assert e.value.code == 2 and "--no-such-option" in capsys.readouterr().err


def _interrupting_trainer(monkeypatch, checkpoints: list[int]):
    """A local trainer that has saved `checkpoints` (step numbers) when Ctrl-C arrives."""
    import digenrl.train.trainer

    class Interrupted:
        def __init__(self, cfg, progress=True):
            self.run_dir = Path(cfg.run.run_dir)

        def train(self, resume=False):
            for step in checkpoints:  # the layout checkpoint.save_checkpoint writes
                d = self.run_dir / "checkpoints" / f"step_{step:06d}"
                d.mkdir(parents=True)
                (d / "state.json").write_text(json.dumps({"step": step}))
            raise KeyboardInterrupt

    monkeypatch.setattr(digenrl.train.trainer, "Trainer", Interrupted)


def test_ctrl_c_says_where_the_run_stopped_and_how_to_resume(tmp_path, monkeypatch, capsys):
    _interrupting_trainer(monkeypatch, [10, 20])
    run_dir = tmp_path / "my run"
    argv = ["--steps", "40", "run.mode=local", "--run-dir", str(run_dir), "reward.weights={toy-geneval: 1.0}"]
    assert main(["train", *argv]) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"latest checkpoint: step 20 ({run_dir / 'checkpoints' / 'step_000020'})" in err
    command = err.strip().splitlines()[-1].strip()
    assert shlex.split(command) == ["digenrl", "train", *argv, "--resume"]  # the user's words, quoted for a shell


def test_ctrl_c_before_any_checkpoint(tmp_path, monkeypatch, capsys):
    _interrupting_trainer(monkeypatch, [])
    argv = ["run.mode=local", "--run-dir", str(tmp_path), "--resume"]
    assert main(["train", *argv]) == 130
    err = capsys.readouterr().err
    assert f"no checkpoint in {tmp_path} yet" in err
    assert shlex.split(err.strip().splitlines()[-1]) == ["digenrl", "train", *argv]  # --resume only once


def test_a_lost_trainer_rank_exits_3_with_the_resume_hint(tmp_path, monkeypatch, capsys):
    """What the driver raises when a rank of a trainer gang dies (tests/runtime/test_gangs.py
    kills one for real) reaches the shell as exit code 3 and one line saying --resume."""
    import digenrl.runtime.driver
    from digenrl.runtime.loop import WorkerLostError

    class Lost:
        def __init__(self, cfg, progress=True):
            pass

        def train(self, resume=False):
            raise WorkerLostError("trainer-1", "trainer", RuntimeError("rank 1 died"))

    monkeypatch.setattr(digenrl.runtime.driver, "RayDriver", Lost)
    code = main(["train", "--run-dir", str(tmp_path), "run.mode=gap+tsp", "runtime.trainer.workers=2",
                 "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp"])
    err = capsys.readouterr().err
    assert code == 3 and "trainer-1" in err and "--resume" in err and "Traceback" not in err

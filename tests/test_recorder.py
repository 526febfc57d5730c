"""The run recorder: cadence rules, the per-step line, and one summary for both trainers."""

import pytest

from digenrl.config import load_config
from digenrl.outputs import read_metrics
from digenrl.recorder import RunRecorder, step_line


def _recorder(tmp_path, *extra, progress=False):
    cfg = load_config(None, [f"run.run_dir={tmp_path}", "run.mode=local", "run.tensorboard=false", *extra])
    return RunRecorder(cfg, progress=progress)


# -- cadence ------------------------------------------------------------------------------------
def test_cadence_of_a_fresh_run(tmp_path):
    rec = _recorder(tmp_path, "train.steps=7", "run.eval_every=2", "run.checkpoint_every=3")
    rec.open(None)
    # eval: the base model (0), every 2nd step, and the last (7)
    assert [s for s in range(8) if rec.eval_due(s)] == [0, 2, 4, 6, 7]
    # checkpoints: every 3rd step and the last; never the base model
    assert [s for s in range(8) if rec.checkpoint_due(s)] == [3, 6, 7]
    rec.close()


def test_cadence_of_a_resumed_run(tmp_path):
    rec = _recorder(tmp_path, "train.steps=7", "run.eval_every=2", "run.checkpoint_every=3")
    rec.open(4)
    # step 4 was evaluated and saved before the interruption; the base model is not redone
    assert [s for s in range(8) if rec.eval_due(s)] == [6, 7]
    assert [s for s in range(8) if rec.checkpoint_due(s)] == [6, 7]
    rec.close()


def test_cadence_zero_means_last_step_only(tmp_path):
    rec = _recorder(tmp_path, "train.steps=5", "run.eval_every=0", "run.checkpoint_every=0")
    rec.open(None)
    assert [s for s in range(6) if rec.eval_due(s)] == [0, 5]
    assert [s for s in range(6) if rec.checkpoint_due(s)] == [5]
    rec.close()


# -- per-step records ---------------------------------------------------------------------------
RECORD = {"step": 3, "reward_mean": 0.51234, "reward_std": 0.04321, "loss": -1.5e-6, "samples_per_s": 12.345}


def test_step_line_fields():
    assert step_line(RECORD) == "step    3  reward 0.5123 +- 0.0432  loss -1.50e-06  12.3 samples/s"
    ray = {**RECORD, "staleness_max": 1, "bubble_ratio_rollout": 0.125, "bubble_ratio_trainer": 0.5,
           "eval/reward_mean": 0.7}
    assert step_line(ray) == ("step    3  reward 0.5123 +- 0.0432  loss -1.50e-06  12.3 samples/s"
                              "  staleness 1  bubble r/t 0.12/0.50  eval 0.7000")


def test_log_writes_every_record_and_prints_step_records_only(tmp_path, capsys):
    rec = _recorder(tmp_path, "train.steps=4", progress=True)
    rec.open(None)
    rec.log({"step": 0, "eval/reward_mean": 0.5})  # the base model's evaluation: no step line
    rec.log(RECORD)
    assert rec._bar.n == 3  # the bar follows the record's step
    rec.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 3]
    assert capsys.readouterr().out.splitlines() == [step_line(RECORD)]


def test_quiet_recorder_prints_nothing(tmp_path, capsys):
    rec = _recorder(tmp_path, "train.steps=4")
    rec.open(None)
    rec.log(RECORD)
    rec.close()
    assert capsys.readouterr().out == ""
    assert len(read_metrics(tmp_path)) == 1


def test_extra_summary_keys_may_not_replace_common_ones(tmp_path):
    rec = _recorder(tmp_path)
    with pytest.raises(ValueError, match="wall_s"):
        rec.finish({}, None, steps=0, wall_s=0.0, extra={"wall_s": 1.0})

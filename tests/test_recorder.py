"""The run recorder: cadence rules, the per-step line, and one summary for both trainers."""

import io
import json
import re

import pytest

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.io.recorder import SUMMARY_KEYS, RunRecorder, rate_line, step_line
from digenrl.train.trainer import Trainer


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


class Terminal(io.StringIO):
    """A captured stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_log_writes_every_record_and_prints_step_records_only(tmp_path, capsys):
    rec = _recorder(tmp_path, "train.steps=4", progress=True)
    rec.open(None)
    rec.log({"step": 0, "eval/reward_mean": 0.5})  # the base model's evaluation: no step line
    rec.log(RECORD)
    rec.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 3]
    assert capsys.readouterr().out.splitlines() == [step_line(RECORD)]


def test_in_a_file_one_line_per_step_and_no_bar_frames(tmp_path):
    """`digenrl train > log 2>&1`: stdout and stderr are files; the log holds the step lines,
    one per step, and no carriage-return frame of the bar."""
    log = io.StringIO()  # both streams go to one file
    rec = RunRecorder(load_config(None, [f"run.run_dir={tmp_path}", "run.mode=local", "run.tensorboard=false",
                                         "train.steps=4"]), progress=True, out=log, err=log)
    rec.open(None)
    for step in (1, 2, 3):
        rec.log({**RECORD, "step": step})
    rec.close()
    assert "\r" not in log.getvalue()
    assert log.getvalue().splitlines() == [step_line({**RECORD, "step": s}) for s in (1, 2, 3)]


@pytest.mark.parametrize("terminal", ["out", "err"])
def test_the_bar_needs_both_streams_to_be_terminals(tmp_path, terminal):
    out, err = (Terminal(), io.StringIO()) if terminal == "out" else (io.StringIO(), Terminal())
    rec = RunRecorder(load_config(None, [f"run.run_dir={tmp_path}", "run.mode=local", "run.tensorboard=false",
                                         "train.steps=4"]), progress=True, out=out, err=err)
    rec.open(None)
    rec.log(RECORD)
    rec.close()
    assert "\r" not in out.getvalue() + err.getvalue()
    assert out.getvalue() == step_line(RECORD) + "\n"


def test_on_a_terminal_the_bar_stays(tmp_path):
    out, err = Terminal(), Terminal()
    rec = RunRecorder(load_config(None, [f"run.run_dir={tmp_path}", "run.mode=local", "run.tensorboard=false",
                                         "train.steps=4"]), progress=True, out=out, err=err)
    rec.open(None)
    rec.log(RECORD)
    assert rec._bar.n == 3  # the bar follows the record's step
    rec.close()
    assert "\r" in err.getvalue() and "3/4" in err.getvalue()  # the bar's frames, on stderr
    assert step_line(RECORD) in out.getvalue().splitlines()


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


def test_summary_puts_achieved_beside_predicted_samples_per_s(tmp_path):
    rec = _recorder(tmp_path, "train.steps=2")
    rec.open(None)
    rec.log({"step": 0, "eval/reward_mean": 0.5})  # the step-0 evaluation carries no samples
    for step in (1, 2):
        rec.log({**RECORD, "step": step, "samples": 32})
    rec.close()
    # 64 RL-step samples in 4 s of RL steps: 16 samples/s; runtime.plan predicted 20
    planned = rec.finish({}, None, steps=2, wall_s=4.0, extra={"predicted_samples_per_s": 20.0})
    assert planned["samples_per_s"] == pytest.approx(16.0)
    assert planned["achieved_over_predicted"] == pytest.approx(0.8)
    assert json.loads((tmp_path / "summary.json").read_text()) == planned
    assert "16.0 achieved" in rate_line(planned) and "20.0 predicted" in rate_line(planned)
    assert rate_line(planned).endswith("achieved/predicted 0.80")
    # a run without a plan (local, runtime.plan=never, resumed): the achieved rate alone
    unplanned = rec.finish({}, None, steps=2, wall_s=8.0)
    assert unplanned["samples_per_s"] == pytest.approx(8.0) and "achieved_over_predicted" not in unplanned
    assert "predicted" not in rate_line(unplanned)
    assert rate_line({**unplanned, "samples_per_s": None}) is None


# -- one summary for the local and the Ray trainer ----------------------------------------------
TINY = ["train.steps=2", "data.groups_per_step=2", "data.micro_batch_groups=1", "data.eval_samples=1",
        "data.eval_max_prompts=2", "sampling.num_steps=3", "run.tensorboard=false", "reward.threads=1"]
LINE = re.compile(r"^step +(\d+)  reward \d\.\d{4} \+- \d\.\d{4}  loss [+-]\d\.\d\de[+-]\d\d  [\d.]+ samples/s")


# the slow tier: the default tier checks the Ray run's summary against the single-device run's
# in tests/runtime/test_equivalence.py (test_on_policy_modes_match_single_device)
@pytest.mark.slow
def test_local_and_ray_runs_write_the_same_summary(ray_cluster, tmp_path, capsys):
    from digenrl.runtime.driver import RayDriver

    local = Trainer(load_config(None, ["run.mode=local", *TINY, f"run.run_dir={tmp_path / 'local'}"])).train()
    local_out = capsys.readouterr().out
    ray_cfg = load_config(None, ["run.mode=gap", *TINY, f"run.run_dir={tmp_path / 'gap'}",
                                 "runtime.rollout.workers=1", "runtime.trainer.workers=1"])
    ray = RayDriver(ray_cfg).train()
    ray_out = capsys.readouterr().out

    for summary, run in ((local, tmp_path / "local"), (ray, tmp_path / "gap")):
        assert json.loads((run / "summary.json").read_text()) == summary
    assert set(local) == set(SUMMARY_KEYS)
    assert set(ray) >= set(local) and {"scheduler", "trace", "gantt"} <= set(ray)
    assert (local["mode"], ray["mode"]) == ("local", "gap")
    # same meaning: the gap mode is on-policy, so it evaluates the same base model and ends
    # with the same weights (up to summation order, see tests/runtime/test_equivalence.py)
    assert local["steps"] == ray["steps"] == 2
    assert ray["eval_reward_before"] == pytest.approx(local["eval_reward_before"], abs=1e-6)
    assert ray["eval_reward_after"] == pytest.approx(local["eval_reward_after"], abs=1e-4)
    for s in (local, ray):
        assert s["wall_s"] > 0
        assert s["final_policy"] == str(tmp_path / s["mode"] / "final" / "policy.safetensors")
        assert (tmp_path / s["mode"] / "final" / "policy.safetensors").exists()
        assert (tmp_path / s["mode"] / "reward_curve.png").exists()

    # one per-step line format: the Ray lines are the local ones plus Ray's optional fields
    local_lines = [l for l in local_out.splitlines() if LINE.match(l)]
    ray_lines = [l for l in ray_out.splitlines() if LINE.match(l)]
    assert [LINE.match(l).group(1) for l in local_lines] == ["1", "2"]
    assert [LINE.match(l).group(1) for l in ray_lines] == ["1", "2"]
    assert all("staleness" not in l and "bubble" not in l for l in local_lines)
    assert all("  staleness 0  bubble r/t " in l for l in ray_lines)
    assert "eval " in local_lines[-1] and "eval " in ray_lines[-1]  # the last step is evaluated

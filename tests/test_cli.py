"""The `digenrl` command line: errors before work, delegated subcommands get their argv."""

from digenrl.cli import main


def test_bad_config_exits_2_naming_the_key(capsys):
    assert main(["train", "data.group_size=1"]) == 2
    assert "data.group_size" in capsys.readouterr().err


def test_simulate_receives_its_own_options(capsys):
    assert main(["simulate", "--testbed", "small-h200x16-sd35", "--steps", "6", "--modes", "colocated,digenrl"]) == 0
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

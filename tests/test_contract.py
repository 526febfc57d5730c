"""One contract from plan to run: the planner's config runs unchanged, as simulated."""

import json

import pytest

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.config.contract import contract, step_shape, tsp_chunk
from digenrl.sched import Scheduler
from digenrl.sim.costs import default_cost_model
from digenrl.sim.engine import run_virtual
from digenrl.sim.testbed import load_testbed
from digenrl.sim.workload import duration_fn

SMALL = "small-h200x16-sd35"


def test_step_shape_cuts_groups_only_when_asked():
    whole = step_shape(load_config(None, ["data.groups_per_step=3", "data.group_size=4", "data.micro_batch_groups=2"]))
    assert whole.micro_batches() == [(0, 1), (2,)]
    assert whole.samples((2,)) == [(2, 0), (2, 1), (2, 2), (2, 3)]
    cut = step_shape(load_config(None, ["run.mode=colocated", "data.groups_per_step=3", "data.group_size=4",
                                        "data.micro_batch_samples=5"]))
    assert cut.micro_batches() == [(0, 1, 2, 3, 4), (5, 6, 7, 8, 9), (10, 11)]
    assert cut.samples((5, 6, 7, 8, 9)) == [(1, 1), (1, 2), (1, 3), (2, 0), (2, 1)]


@pytest.mark.parametrize("mode,chunk,expect", [("local", 0, 9), ("gap", 0, 9), ("gap+tsp", 0, 1),
                                               ("digenrl", 3, 3), ("colocated", 3, 3)])
def test_tsp_chunk_means_one_thing_in_every_mode(mode, chunk, expect):
    cfg = load_config(None, [f"run.mode={mode}", f"train.tsp_chunk={chunk}"])
    assert tsp_chunk(cfg, 9) == expect
    if mode != "local":
        sched = contract(cfg).sched
        assert (sched.tsp_chunk if sched.tsp else 9) == expect


def test_contract_pools_and_workers():
    run = contract(load_config(None, ["run.mode=colocated", "runtime.rollout.workers=1",
                                      "runtime.trainer.workers=2", "runtime.reward.workers=1"]))
    assert [w.id for w in run.workers()] == ["colocated-0", "colocated-1", "colocated-2", "reward-0"]
    run = contract(load_config(None, ["run.mode=digenrl", "runtime.rollout.workers=0"]))  # TAG only
    assert [w.role for w in run.workers()] == ["trainer"]


@pytest.mark.parametrize("overrides,key", [
    (["runtime.trainer.gang=2"], "runtime.trainer.shard"),
    (["runtime.rollout.gang=2"], "runtime.rollout.gang"),
    (["runtime.trainer.offload=true"], "runtime.trainer.offload"),
    (["runtime.trainer.reshard=after-backward"], "runtime.trainer.reshard"),
    (["runtime.trainer.shard=fsdp", "model.dtype=float16"], "model.dtype"),
    (["runtime.trainer.shard=fsdp", "model.device=cuda", "runtime.trainer.num_gpus=0.5"], "runtime.trainer.num_gpus"),
    (["runtime.trainer.shard=fsdp", "model.lora_rank=0", "train.beta=0.1"], "train.beta"),
    (["run.mode=gap", "data.micro_batch_samples=2"], "data.micro_batch_samples"),
    (["run.mode=digenrl", "reward.adv_std=global"], "reward.adv_std"),
    (["run.mode=colocated", "data.micro_batch_samples=3", "reward.aggregate=gdpo", "reward.adv_std=none"],
     "reward.aggregate"),
    (["reward.aggregate=gdpo"], "reward.adv_std"),  # group re-standardising undoes GDPO
    (["reward.combine=normalized"], "reward.combine"),  # renamed: the message names reward.aggregate
    (["train.is_correction=truncated"], "train.is_correction"),  # needs behaviour_logp=recompute
    (["train.is_band=3"], "train.is_band"),  # bounds nothing with is_correction=none
    (["train.loss=nft", "sampling.sde=ode", "train.behaviour_logp=recompute"], "train.behaviour_logp"),
    (["sampling.rollout_dtype=bfloat16", "model.dtype=bfloat16"], "sampling.rollout_dtype"),
    (["run.mode=local", "runtime.plan=always"], "runtime.plan"),
    (["runtime.compute=emulated", "runtime.testbed=x", "runtime.plan=always"], "runtime.plan"),
    (["run.mode=gap", "runtime.rollout.workers=0"], "runtime.rollout.workers"),
    (["runtime.compute=emulated"], "runtime.testbed"),
    (["runtime.compute=emulated", "runtime.testbed=x", "runtime.reward.workers=1"], "runtime.reward.workers"),
])
def test_options_that_cannot_act_are_refused_with_their_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, overrides)


def test_batch_level_modes_take_whole_step_options():
    for mode in ("local", "colocated", "disagg-sync", "one-step-off"):
        load_config(None, [f"run.mode={mode}", "reward.adv_std=global", "data.micro_batch_samples=3"])


def test_emulated_config_must_model_the_testbeds_model():
    cfg = load_config(None, ["runtime.compute=emulated", f"runtime.testbed={SMALL}"])  # tiny-dit
    with pytest.raises(ConfigError, match="model.name"):
        duration_fn(cfg, load_testbed(SMALL), default_cost_model())


def test_plan_writes_a_config_that_train_runs_as_simulated(tmp_path, capsys):
    """digenrl plan --out -> digenrl train --config (emulated compute) -> the simulated schedule."""
    from digenrl.tools.cli import main

    out = tmp_path / "plan.yaml"
    assert main(["plan", "--testbed", SMALL, "--gpus", "8", "--mode", "gap+tsp", "--steps", "3",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "runtime.rollout.workers=" in printed and "n_rollout" not in printed
    cfg = load_config(out)
    assert cfg.runtime.compute == "emulated" and cfg.run.mode == "gap+tsp" and cfg.train.steps == 3
    run = contract(cfg)
    sim = run_virtual(Scheduler(run.sched, run.workers()), duration_fn(cfg, load_testbed(SMALL),
                                                                        default_cost_model(), run))
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(out), "--run-dir", str(run_dir), "--quiet",
                 "runtime.time_scale=0.05"]) == 0
    events = [e for e in json.loads((run_dir / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    threads = {e["args"]["name"] for e in json.loads((run_dir / "trace.json").read_text())["traceEvents"]
               if e.get("name") == "thread_name"}
    assert threads == {w.id for w in run.workers()}
    # On-policy, no TAG: the units are fully determined by the contract; every one ran once.
    assert sorted(e["args"]["unit"] for e in events) == sorted(repr(s.unit) for s in sim.spans)

"""runtime.plan=auto: a Ray run with no pool sizes plans its knobs on this machine and runs them."""

import json

import pytest

from digenrl.config.schema import load_config
from digenrl.runtime.driver import RayDriver
from digenrl.sim import here

from .conftest import tiny

POOLS = ("runtime.rollout.workers=1", "runtime.trainer.workers=1")


# A Ray run end to end (profile, two probes on their own actors, the run): the slow tier. The
# default tier prices probed candidates and plans from profile lines in tests/sim/test_here.py.
@pytest.mark.slow
def test_a_run_without_pool_sizes_runs_its_plan(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(here, "PROBED", 2)  # the config as given and the best other: each probe starts actors
    overrides = [o for o in tiny(tmp_path, "gap+tsp", steps=1) if o not in POOLS]  # pools: 2 + 1, not given
    cfg = load_config(None, overrides + ["runtime.plan_probe_steps=3"])
    assert cfg.wants_plan()
    trainer = RayDriver(cfg, progress=False, evaluate=False)
    summary = trainer.train()
    plan = trainer.here
    assert plan is not None and summary["plan"] == plan.describe()
    assert plan.rate >= plan.given_rate * (1 - 1e-9)  # never worse than the config as given
    # each probe ran its candidate 3 RL steps on its own actors, and the plan priced what they paid
    assert len(plan.probed) == 2 and plan.probed[0][0] is None  # the config as given, probed first
    for i in (1, 2):
        probed = json.loads((tmp_path / "probes" / str(i) / "config.json").read_text())
        assert probed["train"]["steps"] == 3 and probed["runtime"]["plan"] == "never"
        assert (tmp_path / "probes" / str(i) / "trace.jsonl").exists()
        assert not (tmp_path / "probes" / str(i) / "checkpoints").exists()  # a probe keeps no weights
    rt = plan.runtime
    assert rt is not None and rt.units > 0 and rt.dispatch_s > 0 and set(rt.ratio) >= {"generate", "train"}
    profiled = [json.loads(line) for line in (tmp_path / "profile.jsonl").read_text().splitlines()]
    assert here.RuntimeCosts.from_lines(profiled) == rt  # as benchmarks/here_vs_run.py re-prices the run
    ran = json.loads((tmp_path / "config.json").read_text())
    for key, value in plan.overrides.items():  # the run used what it planned
        section, *rest = key.split(".")
        node = ran[section]
        for k in rest:
            node = node[k]
        assert node == value, key
    rt = ran["runtime"]
    assert rt["rollout"]["workers"] + rt["trainer"]["workers"] == 3  # the same devices, split anew
    assert set(trainer.trace.workers) == {f"rollout-{i}" for i in range(rt["rollout"]["workers"])} | \
        {f"trainer-{i}" for i in range(rt["trainer"]["workers"])}
    # each span says when the driver sent its unit (benchmarks/here_vs_run.py splits the gaps by it):
    # before the worker started it, on one node's clock
    spans = trainer.trace.spans
    assert spans and all(s.extra["sent"] <= s.start + 1e-6 for s in spans), \
        [(s.worker, s.kind, s.extra.get("sent"), s.start) for s in spans if s.extra["sent"] > s.start + 1e-6][:3]


def test_given_pools_are_not_planned(tmp_path):
    cfg = load_config(None, tiny(tmp_path, "gap+tsp"))  # gives both pool sizes
    assert not cfg.wants_plan()
    assert load_config(None, tiny(tmp_path, "gap+tsp", "runtime.plan=always")).wants_plan()
    assert not load_config(None, ["runtime.plan=never"]).wants_plan()
    assert not load_config(None, ["run.mode=local"]).wants_plan()


def test_a_config_built_in_code_runs_as_built():
    from digenrl.config.runtime import PoolConfig, RuntimeConfig
    from digenrl.config.schema import Config

    cfg = Config(runtime=RuntimeConfig(rollout=PoolConfig(workers=4), trainer=PoolConfig(workers=2)))
    assert cfg.given is None and not cfg.wants_plan()


def test_resume_keeps_the_plan_of_its_checkpoint(tmp_path):
    from digenrl.runtime.driver import _planned

    ran = load_config(None, ["runtime.rollout.workers=1", "runtime.trainer.workers=2", "data.micro_batch_groups=4",
                             "train.tsp_chunk=3"])
    (tmp_path / "state.json").write_text(json.dumps({"config": ran.to_dict()}))
    cfg = _planned(load_config(None, ["run.seed=5"]), tmp_path)
    assert (cfg.runtime.rollout.workers, cfg.runtime.trainer.workers, cfg.data.micro_batch_groups,
            cfg.train.tsp_chunk, cfg.run.seed) == (1, 2, 4, 3, 5)

"""Planning the run at hand from measured per-unit costs (digenrl.sim.here)."""

import pytest

from digenrl.config.schema import load_config
from digenrl.config.contract import contract
from digenrl.sched import Generate, Train
from digenrl.sim.here import MeasuredCosts, MeasuredDurations, plan_here


def lines(train_ms_per_sample: float) -> list[dict]:
    """Synthetic calibration lines: ms = fixed + slope * batch at batches 1, 2, 4, 8."""
    out = []
    for b in (1, 2, 4, 8):
        out += [{"what": "forward", "batch": b, "ms": 2.0 + 1.0 * b},
                {"what": "fwd+bwd-frozen-base", "batch": b, "ms": 6.0 + train_ms_per_sample * b},
                {"what": "reward", "batch": b, "ms": 1.0 + 0.5 * b}]
    return out + [{"what": "optimizer", "batch": 1, "ms": 5.0}, {"what": "weights", "batch": 1, "ms": 1.0,
                                                                   "bytes": 1000}]


def test_costs_are_linear_fits_of_the_lines():
    c = MeasuredCosts.from_lines(lines(3.0))
    assert c.forward(3) == pytest.approx((2.0 + 3.0) / 1e3) and c.train_step(2) == pytest.approx(12e-3)
    assert c.optimizer_s == pytest.approx(5e-3) and c.weights_bytes == 1000


def test_measured_durations_scale_with_work():
    cfg = load_config(None, ["run.mode=digenrl", "sampling.num_steps=4"])
    run = contract(cfg)
    fn = MeasuredDurations(MeasuredCosts.from_lines(lines(3.0)), run, slowdown=2.0)
    w = run.workers()[0]
    g = fn(w, Generate(0, 0, (0, 1), 0, 0, 4))  # 8 samples, 4 denoising steps
    assert g == pytest.approx(2.0 * 4 * (2.0 + 8.0) / 1e3)
    assert fn(w, Train(0, 0, (0,), (0, 1), 0)) == pytest.approx(2.0 * 2 * (6.0 + 12.0) / 1e3)


def test_expensive_training_moves_workers_to_the_trainer_pool():
    cfg = load_config(None, ["sampling.num_steps=4", "data.groups_per_step=4"])  # default 2 + 1, digenrl
    cheap = plan_here(cfg, lines(0.5), cores=64)
    dear = plan_here(cfg, lines(12.0), cores=64)
    pools = lambda p: [p.overrides.get(f"runtime.{r}.workers", n) for r, n in (("rollout", 2), ("trainer", 1))]  # noqa: E731
    assert pools(dear)[1] > pools(cheap)[1] and sum(pools(dear)) == 3  # overrides hold what changed
    assert dear.rate >= dear.given_rate * (1 - 1e-9)  # never worse than the config as given


def test_given_keys_stay_as_given():
    cfg = load_config(None, ["sampling.num_steps=4", "data.micro_batch_groups=2", "runtime.plan=always",
                             "runtime.rollout.workers=2", "runtime.trainer.workers=1"])
    plan = plan_here(cfg, lines(12.0), cores=64, given=cfg.given)
    assert set(plan.overrides) <= {"train.tsp_chunk"}


def test_a_profile_without_a_kind_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        MeasuredCosts.from_lines([r for r in lines(1.0) if r["what"] != "optimizer"])


def test_pools_that_reserve_differently_keep_their_split():
    cfg = load_config(None, ["sampling.num_steps=4", "runtime.trainer.num_cpus=2"])
    plan = plan_here(cfg, lines(12.0), cores=64)
    assert "runtime.rollout.workers" not in plan.overrides and "runtime.trainer.workers" not in plan.overrides


def test_a_config_built_in_code_is_planned_as_all_given():
    from digenrl.config.schema import Config

    cfg = Config()
    cfg.sampling.num_steps = 4
    plan = plan_here(cfg, lines(12.0), cores=64, given=cfg.given)  # given is None: nothing moves
    assert cfg.given is None and plan.overrides == {} and plan.rate == pytest.approx(plan.given_rate)

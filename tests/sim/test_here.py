"""Planning the run at hand from measured per-unit costs (digenrl.sim.here)."""

import pytest

from digenrl.config.schema import load_config
from digenrl.config.contract import contract
from digenrl.sched import Generate, Reward, Train, kind
from digenrl.sim.here import (PROBE_STEPS, PROBED, MeasuredCosts, MeasuredDurations, RuntimeCosts, eval_cpu_s,
                              plan_here, probe_steps)


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


def _spans(fn, run, plan, gap=0.005, ratio=2.0):
    """Spans on the contract's first workers back to back: each `ratio` x its charge, `gap` after
    the previous one on its worker, sent as that one ended; RL step 0's ten times slower."""
    from digenrl.io.trace import Span

    out, clock = [], {}
    for step, w, unit in plan:
        worker = run.workers()[w]
        start = clock.get(worker.id, 0.0) + gap
        long = (10 if step == 0 else 1) * ratio * fn(worker, unit)
        out.append(Span(worker.id, kind(unit), start, start + long, 0, step, {"sent": start - gap}, unit))
        clock[worker.id] = start + long
    return out


def test_runtime_costs_are_read_off_a_runs_spans():
    cfg = load_config(None, ["run.mode=digenrl", "sampling.num_steps=4"])
    run = contract(cfg)
    fn = MeasuredDurations(MeasuredCosts.from_lines(lines(3.0)), run, slowdown=1.5)
    units = [Generate(s, 0, (0, 1), 0, 0, 4) for s in range(3)] + [Train(s, 0, (0,), (0, 1), 0) for s in range(3)]
    plan = [(u.step, i % 2, u) for i, u in enumerate(units)]
    rt = RuntimeCosts.measure(_spans(fn, run, plan), fn, steps=(1, 2))  # step 0 (ten times slower) is left out
    roles = {run.workers()[0].role, run.workers()[1].role}
    assert set(rt.ratio) == {"generate", "train"} | {f"{k}@{r}" for k in ("generate", "train") for r in roles}
    assert all(r == pytest.approx(2.0) for r in rt.ratio.values()) and rt.dispatch_s == pytest.approx(0.005)
    assert rt.units == 4 and RuntimeCosts.measure(_spans(fn, run, plan), fn, steps=(1, 1)).units == 2
    assert RuntimeCosts.from_lines([rt.line()]) == rt
    priced = MeasuredDurations(fn.c, run, 1.5, rt)
    w = run.workers()[0]
    assert priced(w, units[1]) == pytest.approx(2.0 * fn(w, units[1]) + 0.005)
    with pytest.raises(ValueError, match="plan_probe_steps"):
        RuntimeCosts.measure(_spans(fn, run, plan), fn, steps=(5, 6))


def test_a_unit_is_priced_with_its_roles_ratio_else_its_kinds():
    cfg = load_config(None, ["run.mode=digenrl", "sampling.num_steps=4"])
    run = contract(cfg)
    rollout, trainer = (next(w for w in run.workers() if w.role == r) for r in ("rollout", "trainer"))
    rt = RuntimeCosts({"generate": 1.5, "generate@trainer": 3.0, "train": 2.0}, 0.0, 1)
    g = Generate(0, 0, (0, 1), 0, 0, 4)
    assert rt.of(trainer, g) == 3.0 and rt.of(rollout, g) == 1.5  # a role the probe did not see: the kind's
    assert rt.of(trainer, Train(0, 0, (0,), (0, 1), 0)) == 2.0 and rt.of(trainer, Reward(0, 0, (0, 1))) == 1.0
    assert "trainer generate x3.00" in rt.describe()


def test_a_probing_plan_prices_each_probed_candidate_with_its_own_probe():
    cfg = load_config(None, ["sampling.num_steps=4", "data.groups_per_step=4"])
    compute_only = plan_here(cfg, lines(12.0), cores=64)
    moved = compute_only.overrides.get("runtime.trainer.workers")
    assert moved is not None  # the compute-only plan moves a worker to the trainer pool
    asked = []

    def probe(c):  # the split the compute-only plan prefers pays ten times its charge
        asked.append((c.runtime.rollout.workers, c.runtime.trainer.workers))
        slow = 10.0 if c.runtime.trainer.workers == moved else 1.0
        return RuntimeCosts({"generate": slow, "train": slow, "reward": slow}, 0.0, 1)

    plan = plan_here(cfg, lines(12.0), cores=64, probe=probe)
    assert len(asked) == len(plan.probed) == PROBED and asked[0] == (2, 1)  # the config as given first
    assert plan.overrides.get("runtime.trainer.workers", 1) != moved and plan.rate < compute_only.rate
    assert plan.rate >= plan.given_rate * (1 - 1e-9) and plan.runtime is not None
    assert "probed" in plan.describe()


def test_evaluation_is_charged_to_every_step_over_the_cores():
    cfg = load_config(None, ["sampling.num_steps=4", "data.groups_per_step=4", "run.eval_every=2"])
    costs = MeasuredCosts.from_lines(lines(3.0))
    bs = cfg.data.micro_batch_groups * cfg.data.group_size
    one = lambda b: cfg.sampling.eval_num_steps * costs.forward(b) + costs.reward(b)  # noqa: E731
    assert eval_cpu_s(cfg, costs, 2 * bs + 3) == pytest.approx((2 * one(bs) + one(3)) / 2)
    assert eval_cpu_s(cfg, costs, 0) == 0.0
    assert eval_cpu_s(load_config(None, ["run.eval_every=0"]), costs, 100) == 0.0
    spp = cfg.data.groups_per_step * cfg.data.group_size
    e = eval_cpu_s(cfg, costs, 64)
    # its CPU over the cores, on every step
    plain, evaluated = plan_here(cfg, lines(3.0), cores=2), plan_here(cfg, lines(3.0), cores=2, eval_samples=64)
    assert spp / evaluated.given_rate == pytest.approx(spp / plain.given_rate + e / 2)


def test_probes_are_opt_in_on_gpu_pools():
    assert probe_steps(None, gpu=False) == PROBE_STEPS and probe_steps(None, gpu=True) == 0  # unset
    assert probe_steps(5, gpu=True) == 5 and probe_steps(0, gpu=False) == 0  # as set

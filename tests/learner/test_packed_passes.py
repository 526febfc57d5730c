"""TSP as batched replay (learner.passes): a unit's (sample, trained slot) pairs flattened into
passes of `pairs_per_pass`, each pair at its own timestep, give the gradient of the
per-timestep loop (one pass per trained step), for every objective, LoRA and full fine-tune.
The diffusers family with CFG is in tests/models/test_conditioned_families.py; the FSDP gang
of 2 in tests/learner/test_sharded.py."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.learner.passes import largest_pass, pass_count, plan_passes
from digenrl.math import sigma_schedule
from digenrl.rollout import SampleSpec, advance, start

from tests.helpers.host_reads import count_host_reads_in_passes

from .tiny_setup import tiny_policy


def test_plan_passes_by_hand():
    # rows [1, 4) x slots (0, 2): pairs (0,1) (0,2) (0,3) (2,1) (2,2) (2,3), slot-major
    assert plan_passes(1, 4, [0, 2]) == [[(0, 1, 4)], [(2, 1, 4)]]  # per timestep, all rows
    assert plan_passes(1, 4, [0, 2], backward_batch=2) == [[(0, 1, 3)], [(0, 3, 4)], [(2, 1, 3)], [(2, 3, 4)]]
    assert plan_passes(1, 4, [0, 2], pairs_per_pass=6) == [[(0, 1, 4), (2, 1, 4)]]  # one pass
    assert plan_passes(1, 4, [0, 2], pairs_per_pass=4) == [[(0, 1, 4), (2, 1, 2)], [(2, 2, 4)]]
    assert plan_passes(1, 4, [0, 2], pairs_per_pass=2) == [[(0, 1, 3)], [(0, 3, 4), (2, 1, 2)], [(2, 2, 4)]]
    assert plan_passes(3, 3, [0]) == [] and plan_passes(0, 2, []) == []


def test_pass_count_and_largest_pass_agree_with_the_plan():
    rng = random.Random(0)
    for _ in range(300):
        rows, slots = rng.randint(0, 9), rng.randint(0, 5)
        bb, ppp = rng.choice([(0, 0), (rng.randint(1, 6), 0), (0, rng.randint(1, 20))])
        plan = plan_passes(0, rows, list(range(slots)), bb, ppp)
        assert pass_count(rows, slots, bb, ppp) == len(plan)
        sizes = [sum(b - a for _, a, b in p) for p in plan]
        assert largest_pass(rows, slots, bb, ppp) == max(sizes, default=0)
        assert sum(sizes) == rows * slots  # every pair once


SPEC = SampleSpec(sigmas=sigma_schedule(4, 3.0), sde_steps=(0, 1, 2), seed=7)
ADV = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]  # three groups of two


def batch(policy, spec=SPEC):
    prompts = ["a red circle", "a red circle", "a blue square", "a blue square", "two green bars", "two green bars"]
    coords = [(0, g, s) for g in range(3) for s in range(2)]
    with torch.no_grad():
        traj = advance(policy, start(policy, prompts, coords, spec, step=0, version=0), spec)
    traj.advantages = torch.tensor(ADV)
    return traj


OBJECTIVES = {
    "grpo": {},
    "grpo-kl": {"beta": 0.1},
    "grpo-guard": {"loss": "grpo-guard"},
    "flow-dppo": {"loss": "flow-dppo"},
    "nft": {"loss": "nft"},
    "nft-old": {"loss": "nft", "nft_decay": 0.5, "nft_beta": 0.7},
    "awm": {"loss": "awm", "awm_weighting": "t"},
    "dpo": {"loss": "dpo", "dpo_beta": 10.0},
}


def gradient(policy, traj, spec, slots, **config):
    learner = Learner(policy, LearnerConfig(grad_sum="float32", **config))
    learner.accumulate(traj, slots, spec, total_samples=len(traj), total_steps=len(slots))
    grads = [p.grad.detach().clone() for p in learner.params]
    sums, weight = learner.accumulated()
    learner.zero_grad()
    return grads, weight


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("objective", list(OBJECTIVES))
def test_packed_gradient_equals_the_per_timestep_loop(objective, lora):
    # float32 throughout; tolerance: a few float32 ulps of the gradient's scale (the pairs are
    # summed in another order and batched with other rows)
    policy = tiny_policy(depth=1, lora_rank=lora)
    traj = batch(policy)
    slots = [0, 1, 2]
    config = OBJECTIVES[objective]
    want, w_want = gradient(policy, traj, SPEC, slots, **config)
    for pairs in (18, 5, 1):  # all 6 x 3 pairs in one pass; uneven cuts across slots; one pair a pass
        got, w_got = gradient(policy, traj, SPEC, slots, pairs_per_pass=pairs, **config)
        assert w_got == pytest.approx(w_want, rel=1e-6)
        for g, r in zip(got, want):
            scale = float(r.abs().max()) + 1e-12
            assert torch.allclose(g, r, rtol=1e-4, atol=1e-5 * scale), (objective, pairs, float((g - r).abs().max()))


def test_the_packed_pass_trains_what_a_different_slot_would_not():
    # the check above can fail: a packed pass whose pairs all read slot 0's timestep differs
    policy = tiny_policy(depth=1)
    traj = batch(policy)
    want, _ = gradient(policy, traj, SPEC, [0, 1], pairs_per_pass=12)
    wrong, _ = gradient(policy, traj, SPEC, [0, 0], pairs_per_pass=12)
    assert any(not torch.allclose(a, b, rtol=1e-3, atol=1e-6) for a, b in zip(want, wrong))


def test_packed_per_sample_levels():
    # sampling.window_draw=sample: each sample trains its own step in a slot, so one pass
    # mixes timesteps even within a slot
    spec = dataclasses.replace(SPEC, sde_steps=(0, 1, 2, 3), draw_levels=4)
    policy = tiny_policy(depth=1)
    traj = batch(policy, spec)
    want, _ = gradient(policy, traj, spec, [0, 1])
    got, _ = gradient(policy, traj, spec, [0, 1], pairs_per_pass=12)
    for g, r in zip(got, want):
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-5 * (float(r.abs().max()) + 1e-12))


def test_ghost_passes_pad_a_unit_and_weigh_nothing():
    # a gang's rank with a smaller share pads to the passes every rank runs
    policy = tiny_policy(depth=1)
    traj = batch(policy)
    learner = Learner(policy, LearnerConfig(pairs_per_pass=4))
    with pytest.raises(ValueError, match="passes cannot train"):
        learner.accumulate(traj, [0, 1], SPEC, total_samples=6, total_steps=2, rows=slice(0, 4), passes=1)
    learner.accumulate(traj, [0, 1], SPEC, total_samples=6, total_steps=2, rows=slice(0, 4), passes=5)
    _, weight = learner.accumulated()
    assert weight == pytest.approx(8 / 12)  # 4 rows x 2 slots of 6 x 2; the 3 ghosts add nothing


def test_pairs_per_pass_and_backward_batch_are_one_knob():
    with pytest.raises(ValueError, match="both size a pass"):
        LearnerConfig(pairs_per_pass=4, backward_batch=2)


def test_no_host_read_inside_a_pass(monkeypatch):
    # Every read of a tensor's value back to the host (bool, float, int, item, tolist, numpy)
    # made while a pass runs is counted: there must be none (on a GPU each stalls the stream);
    # the metrics are read once, at the optimizer step
    policy = tiny_policy(depth=1, lora_rank=4)
    traj = batch(policy)
    reads, inside = count_host_reads_in_passes(monkeypatch)
    for config in ({}, {"loss": "grpo-guard", "beta": 0.1}, {"loss": "nft"}, {"pairs_per_pass": 5}):
        learner = Learner(policy, LearnerConfig(**config))
        learner.accumulate(traj, [0, 1, 2], SPEC, total_samples=6, total_steps=3)
        assert reads == [], (config, reads)
        metrics = learner.optimizer_step()  # the one read, outside the passes
        assert metrics.get("loss/ratio_mean", 1.0) == pytest.approx(1.0) and metrics["train/skipped_units"] == 0.0
    # the counter does count: a read inside a pass is seen
    inside[0] = True
    bool(torch.ones(()))
    inside[0] = False
    assert reads == ["__bool__"]


def test_a_non_finite_pass_skips_the_step_and_is_counted():
    policy = tiny_policy(depth=1)
    traj = batch(policy)
    traj.advantages = torch.tensor([float("nan")] + ADV[1:])
    learner = Learner(policy, LearnerConfig())
    before = [p.detach().clone() for p in learner.params]
    learner.accumulate(traj, [0, 1], SPEC, total_samples=6, total_steps=2)
    metrics = learner.optimizer_step()
    assert metrics["train/skipped_step"] == 1.0 and metrics["train/skipped_units"] == 2.0  # row 0 in both passes
    assert all(torch.equal(a, b) for a, b in zip(before, learner.params))

"""The rollout-train consistency monitor and train.behaviour_logp / train.is_correction in the Learner,
with the gap made on CPU by a bf16 rollout (sampling.rollout_dtype) and an fp32 trainer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.learner.metrics import merge_sums, step_means
from digenrl.math import sigma_schedule
from digenrl.rollout import SampleSpec

from .tiny_setup import tiny_policy, two_sample_batch

SPEC = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(0, 1, 2), seed=5)


def _step_metrics(rollout_dtype: str, **config) -> tuple[dict[str, float], torch.Tensor]:
    """One RL step on a fresh policy whose rollout ran at `rollout_dtype`: (metrics, gradient)."""
    policy = tiny_policy()
    spec = dataclasses.replace(SPEC, rollout_dtype=rollout_dtype)
    traj = two_sample_batch(policy, spec, [1.0, -1.0])
    # the tiny DiT's bf16 gap is ~1e-5 per step-averaged log-prob: a clip range below it shows the clipping
    learner = Learner(policy, LearnerConfig(clip_range=1e-6, **config))
    learner.accumulate(traj, [0, 1, 2], SPEC, total_samples=2, total_steps=3)
    grad = torch.cat([p.grad.flatten() for p in learner.params])
    return learner.optimizer_step(), grad


def test_gap_is_zero_on_policy_at_one_precision_and_not_with_a_bf16_rollout():
    same, _ = _step_metrics("")
    assert same["consistency/gap_abs_max"] == 0.0 and same["consistency/past_clip"] == 0.0
    assert same["loss/clipfrac"] == 0.0
    bf16, _ = _step_metrics("bfloat16")
    assert bf16["consistency/gap_abs_max"] > 1e-6, bf16
    assert bf16["consistency/gap_abs_mean"] > 0.0
    assert bf16["consistency/gap_abs_max"] >= bf16["consistency/gap_abs_mean"]
    # the gap alone clips rows: the clipped loss sees the rollout's bf16 log-prob as the behaviour's
    assert bf16["loss/clipfrac"] == pytest.approx(bf16["consistency/past_clip"]) and bf16["loss/clipfrac"] > 0


def test_recompute_is_a_separate_no_grad_forward_and_unclips_the_gap():
    # the trainer's own log-prob is the loss forward's, detached: equal to a no-grad forward of its own
    policy = tiny_policy()
    spec = dataclasses.replace(SPEC, rollout_dtype="bfloat16")
    traj = two_sample_batch(policy, spec, [1.0, -1.0])
    learner = Learner(policy, LearnerConfig(behaviour_logp="recompute"))
    for t in SPEC.sde_steps:
        with_grad = learner.score(traj, t, SPEC, slice(0, 2)).log_prob.detach()
        with torch.no_grad():
            separate = learner.score(traj, t, SPEC, slice(0, 2)).log_prob
        assert torch.equal(with_grad, separate)
        assert not torch.equal(separate, traj.log_probs[:, t])  # the bf16 rollout recorded another value
    m, grad = _step_metrics("bfloat16", behaviour_logp="recompute")
    assert m["loss/clipfrac"] == 0.0 and m["loss/ratio_mean"] == 1.0
    assert m["consistency/past_clip"] > 0  # the monitor still reports the gap
    # on-policy at one precision, recompute and rollout are the same step
    _, g_rollout = _step_metrics("", behaviour_logp="rollout")
    _, g_recompute = _step_metrics("", behaviour_logp="recompute")
    assert torch.equal(g_rollout, g_recompute)


def test_corrections_weight_the_gradient_row_by_row():
    # row 0's recorded log-prob set so that w = pi_train / pi_rollout = 3 (row 1 has A = 0, so
    # only row 0 counts); band 2: truncated scales row 0's gradient by min(3, 2) = 2, mask drops
    # it (3 > 2); band 4 keeps it (mask) and leaves w = 3 (truncated)
    policy = tiny_policy()
    traj = two_sample_batch(policy, SPEC, [1.0, 0.0])
    t = 0
    logp_train = Learner(policy, LearnerConfig()).score(traj, t, SPEC, slice(0, 2)).log_prob.detach()
    traj.log_probs[0, t] = logp_train[0] - torch.log(torch.tensor(3.0))
    grads = {}
    for kind, band in (("none", 2.0), ("truncated", 2.0), ("truncated", 4.0), ("mask", 2.0), ("mask", 4.0)):
        learner = Learner(policy, LearnerConfig(behaviour_logp="recompute", is_correction=kind, is_band=band))
        learner.accumulate(traj, [t], SPEC, total_samples=2, total_steps=1)
        grads[kind, band] = torch.cat([p.grad.flatten() for p in learner.params])
        learner.zero_grad()
    base = grads["none", 2.0]
    assert base.abs().max() > 0
    assert torch.allclose(grads["truncated", 2.0], 2.0 * base, rtol=1e-4, atol=1e-9)
    assert torch.allclose(grads["truncated", 4.0], 3.0 * base, rtol=1e-4, atol=1e-9)
    assert torch.equal(grads["mask", 2.0], torch.zeros_like(base))
    assert torch.allclose(grads["mask", 4.0], base, rtol=1e-4, atol=1e-9)


def test_max_metrics_combine_by_max_and_the_rest_by_weighted_mean():
    a = {"consistency/gap_abs_max": 0.2, "consistency/gap_abs_mean": 0.1 * 2}  # weight 2
    b = {"consistency/gap_abs_max": 0.5, "consistency/gap_abs_mean": 0.4 * 1}  # weight 1
    m = step_means(merge_sums([a, b]), 3.0)
    assert m == {"consistency/gap_abs_max": 0.5, "consistency/gap_abs_mean": pytest.approx(0.6 / 3)}

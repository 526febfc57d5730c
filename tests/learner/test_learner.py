"""Learner.zero_grad: an abandoned accumulation leaves no trace in the next optimizer step."""

from __future__ import annotations

import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.rollout import SampleSpec

from .tiny_setup import tiny_policy, two_sample_batch


def test_zero_grad_discards_an_accumulation():
    spec = SampleSpec(sigmas=sigma_schedule(3, 1.0), sde_steps=(0, 1))
    policy = tiny_policy()
    kept, dropped = two_sample_batch(policy, spec, [1.0, -1.0]), two_sample_batch(policy, spec, [-3.0, 2.0])

    fresh = Learner(tiny_policy(), LearnerConfig())
    fresh.accumulate(kept, [0, 1], spec, total_samples=2, total_steps=2)
    want = fresh.optimizer_step()

    learner = Learner(policy, LearnerConfig())
    learner.accumulate(dropped, [0], spec, total_samples=2, total_steps=1)
    assert all(p.grad is not None for p in learner.params)
    learner.zero_grad()
    assert all(p.grad is None for p in learner.params)
    learner.accumulate(kept, [0, 1], spec, total_samples=2, total_steps=2)
    got = learner.optimizer_step()
    # same policy weights and the same kept unit: the dropped unit changed neither the
    # gradient (norm) nor the loss means
    assert got == want
    for a, b in zip(learner.params, fresh.params):
        assert torch.equal(a, b)

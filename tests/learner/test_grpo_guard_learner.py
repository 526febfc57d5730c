"""train.loss=grpo-guard in the Learner: the behaviour mean it rebuilds and the gradient it backwards."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sde_step, sigma_schedule
from digenrl.rollout import SampleSpec

from .tiny_setup import tiny_policy, two_sample_batch


@pytest.mark.parametrize("kind", ["flow-sde", "dance-sde"])
def test_behaviour_mean_is_the_rollouts_mean(kind):
    # latents[:, t+1] - std * noise(seed, coords, t) is the mean the sampler drew around;
    # with the rollout's own weights the learner's recomputed mean is that mean
    spec = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(0, 1, 2), kind=kind, seed=3)
    policy = tiny_policy()
    traj = two_sample_batch(policy, spec, [1.0, -1.0])
    learner = Learner(policy, LearnerConfig(loss="grpo-guard"))
    for t in spec.sde_steps:
        out = learner.score(traj, t, spec, slice(0, 2))
        rebuilt = learner._behaviour_mean(traj, learner._pairs(traj, [(t, 0, 2)], spec), spec, out.std)
        assert torch.allclose(rebuilt, out.mean, atol=1e-5), float((rebuilt - out.mean).abs().max())
        other = learner._behaviour_mean(traj, learner._pairs(traj, [(t, 0, 2)], spec),
                                        dataclasses.replace(spec, seed=4), out.std)
        assert not torch.allclose(other, out.mean, atol=1e-2)  # the noise is what makes it right


def test_on_policy_gradient_is_grpos_times_std_over_dt():
    # one trained step t on-policy: ratio 1, the drift's gradient ~0, so the guard gradient
    # is std_t / dt_t times grpo's (math test: test_on_policy_gradient_is_grpos_times_std_over_dt)
    spec = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(0, 1, 2))
    t = 1
    grads = {}
    for loss in ("grpo", "grpo-guard"):
        policy = tiny_policy()
        traj = two_sample_batch(policy, spec, [1.0, -0.5])
        learner = Learner(policy, LearnerConfig(loss=loss))
        learner.accumulate(traj, [t], spec, total_samples=2, total_steps=1)
        grads[loss] = torch.cat([p.grad.flatten() for p in learner.params])
        metrics = learner.optimizer_step()
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    s, s_next = float(spec.sigmas[t]), float(spec.sigmas[t + 1])
    std = float(sde_step(torch.zeros(1, 1), torch.zeros(1, 1), s, s_next, kind="flow-sde", noise_level=0.7).std)
    assert grads["grpo"].abs().max() > 0
    assert torch.allclose(grads["grpo-guard"], grads["grpo"] * std / (s - s_next), rtol=1e-3, atol=1e-7)


def test_refuses_cps_and_unknown_losses():
    spec = SampleSpec(sigmas=sigma_schedule(3, 1.0), sde_steps=(0, 1), kind="cps")
    policy = tiny_policy()
    traj = two_sample_batch(policy, spec, [1.0, -1.0])
    with pytest.raises(ValueError, match="Gaussian"):
        Learner(policy, LearnerConfig(loss="grpo-guard")).accumulate(traj, [0], spec, total_samples=2, total_steps=1)
    with pytest.raises(ValueError, match="grpo-guard"):
        LearnerConfig(loss="guard")

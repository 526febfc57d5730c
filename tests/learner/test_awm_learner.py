"""train.loss=awm in the Learner: ODE rollouts, the unit as the formula, layout, LoRA and full."""

from __future__ import annotations

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import sigma_schedule
from digenrl.rollout import SampleSpec
from digenrl.rollout.sampler import forward_targets

from .tiny_setup import tiny_policy, two_sample_batch

ODE = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(), kind="ode", seed=5, draw_levels=4)


def _grads(learner):
    return torch.cat([p.grad.flatten() for p in learner.params])


@pytest.mark.parametrize("lora_rank", [0, 4])  # full fine-tune and LoRA
def test_awm_unit_is_advantage_weighted_flow_matching_on_the_clean_sample(lora_rank):
    # slot 1 of an ODE rollout (no log-probs): the gradient is that of
    # mean_B( A' mean((v - (eps - x0))^2) ) with A' = clip(A, -4, 4) * 0.5 / 4 and x_t, eps
    # redrawn by forward_targets, plus the KL weight 0 (none): the on-policy AWM loss
    policy = tiny_policy(lora_rank=lora_rank)
    traj = two_sample_batch(policy, ODE, [6.0, -1.0])
    assert torch.isnan(traj.log_probs).all()
    learner = Learner(policy, LearnerConfig(loss="awm", adv_clip=4.0, awm_adv_max=0.5))
    learner.accumulate(traj, [1], ODE, total_samples=2, total_steps=1)
    got = _grads(learner)
    assert got.abs().max() > 0
    metrics = learner.optimizer_step()
    assert metrics["loss/ratio_mean"] == 1.0 and metrics["loss/clipfrac"] == 0.0
    learner.optimizer.zero_grad(set_to_none=True)

    fresh = tiny_policy(lora_rank=lora_rank)  # the weights before the step
    x0 = traj.latents[:, ODE.num_steps]
    x_t, sigma = forward_targets(x0, ODE, traj.coords, 1)
    eps = (x_t - (1 - sigma[:, None, None, None]) * x0) / sigma[:, None, None, None]
    v = fresh.velocity(x_t, sigma, traj.cond)
    adv = torch.tensor([4.0, -1.0]) * 0.5 / 4.0
    (adv * ((v - (eps - x0)) ** 2).mean(dim=(1, 2, 3))).mean().backward()
    want = torch.cat([p.grad.flatten() for p in fresh.module.parameters() if p.requires_grad])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def test_awm_kl_to_the_base_model_and_weighting_change_the_gradient():
    policy = tiny_policy(lora_rank=4)
    traj = two_sample_batch(policy, ODE, [1.5, -1.0])
    grads = {}
    for name, cfg in {"plain": {}, "kl": {"beta": 1.0}, "ghuber": {"awm_weighting": "ghuber"}}.items():
        learner = Learner(policy, LearnerConfig(loss="awm", **cfg))
        learner.accumulate(traj, [0, 2], ODE, total_samples=2, total_steps=2)
        grads[name] = _grads(learner)
        policy.module.zero_grad(set_to_none=True)
    # LoRA B is off zero (tiny_policy), so the live policy is not the base: the KL pulls
    for name in ("kl", "ghuber"):
        assert (grads[name] - grads["plain"]).abs().max() > 1e-3 * grads["plain"].abs().max(), name


def test_awm_unit_layout_does_not_change_the_step_gradient():
    slots = list(range(ODE.draw_levels))
    policy = tiny_policy()
    traj = two_sample_batch(policy, ODE, [1.5, -1.0])
    whole = Learner(policy, LearnerConfig(loss="awm"))
    whole.accumulate(traj, slots, ODE, total_samples=2, total_steps=len(slots))
    want = _grads(whole)
    split = Learner(policy, LearnerConfig(loss="awm"))
    split.optimizer.zero_grad(set_to_none=True)
    for rows in (slice(0, 1), slice(1, 2)):
        for t in slots:
            split.accumulate(traj, [t], ODE, total_samples=2, total_steps=len(slots), rows=rows)
    torch.testing.assert_close(_grads(split), want, rtol=1e-5, atol=1e-8)

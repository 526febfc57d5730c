"""train.loss=nft and per-sample trained steps (SampleSpec.draw_levels) in the Learner."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from digenrl.learner import Learner, LearnerConfig
from digenrl.math import nft_loss, sigma_schedule
from digenrl.rollout import SampleSpec
from digenrl.rollout.sampler import forward_targets, trained_steps

from .tiny_setup import tiny_policy, two_sample_batch

ODE = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(), kind="ode", seed=5, draw_levels=4)


def _grads(learner):
    return torch.cat([p.grad.flatten() for p in learner.params])


def test_per_sample_draw_covers_every_level_once():
    coords = [(0, g, s) for g in range(3) for s in range(4)]
    table = torch.tensor([trained_steps(ODE, coords, j) for j in range(4)])  # (slot, sample)
    assert all(sorted(col) == [0, 1, 2, 3] for col in table.T.tolist())  # each sample: every level once
    assert len({tuple(col) for col in table.T.tolist()}) > 1  # samples draw different orders
    assert trained_steps(dataclasses.replace(ODE, draw_levels=0), coords, 2) == [2] * 12
    with pytest.raises(ValueError, match="out of range"):
        trained_steps(ODE, coords, 4)


def test_forward_targets_noise_the_clean_sample_at_its_level():
    x0 = torch.randn(3, 2, 4, 4)
    coords = [(1, 0, 0), (1, 0, 1), (1, 1, 0)]
    x_t, sigma = forward_targets(x0, ODE, coords, 1)
    levels = trained_steps(ODE, coords, 1)
    assert sigma.tolist() == pytest.approx(ODE.sigmas[levels].tolist())
    eps = (x_t - (1 - sigma[:, None, None, None]) * x0) / sigma[:, None, None, None]
    assert abs(float(eps.std()) - 1.0) < 0.35  # standard normal noise
    again, _ = forward_targets(x0[1:], ODE, coords[1:], 1)  # rows in another layout: same targets
    torch.testing.assert_close(again, x_t[1:])
    other, _ = forward_targets(x0, ODE, coords, 2)
    assert not torch.allclose(other, x_t)


def test_nft_trains_an_ode_rollout_and_grpo_refuses_it():
    policy = tiny_policy()
    traj = two_sample_batch(policy, ODE, [1.0, -1.0])
    assert torch.isnan(traj.log_probs).all()
    with pytest.raises(ValueError, match="sampled with the ODE"):
        Learner(policy, LearnerConfig()).accumulate(traj, [0], ODE, total_samples=2, total_steps=1)
    learner = Learner(policy, LearnerConfig(loss="nft"))
    learner.accumulate(traj, [0, 1, 2, 3], ODE, total_samples=2, total_steps=4)
    assert _grads(learner).abs().max() > 0
    metrics = learner.optimizer_step()
    assert metrics["loss/nft_r_mean"] == pytest.approx(0.5 + 0.5 * (1.0 - 1.0) / 5 / 2)


def test_nft_unit_is_the_formula_on_the_clean_sample():
    # the learner's gradient for slot 2 is nft_loss on x0 = latents[:, T] noised by forward_targets,
    # with v_old = the same weights' velocity (the policy at the start of the step)
    policy = tiny_policy()
    traj = two_sample_batch(policy, ODE, [2.0, -0.5])
    learner = Learner(policy, LearnerConfig(loss="nft", adv_clip=4.0))
    learner.accumulate(traj, [2], ODE, total_samples=2, total_steps=1)
    got = _grads(learner)
    learner.optimizer.zero_grad(set_to_none=True)
    x0 = traj.latents[:, ODE.num_steps]
    x_t, sigma = forward_targets(x0, ODE, traj.coords, 2)
    v = policy.velocity(x_t, sigma, traj.cond)
    loss, _ = nft_loss(v, v.detach(), x_t, x0, sigma, traj.advantages, beta=1.0, adv_clip=4.0)
    loss.backward()
    torch.testing.assert_close(got, _grads(learner), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("loss,spec", [
    ("nft", ODE),
    ("grpo", SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(0, 1, 2), kind="dance-sde", seed=2, draw_levels=3)),
])
def test_unit_layout_does_not_change_the_step_gradient(loss, spec):
    slots = list(range(spec.draw_levels))
    policy = tiny_policy()
    traj = two_sample_batch(policy, spec, [1.5, -1.0])
    whole = Learner(policy, LearnerConfig(loss=loss))
    whole.accumulate(traj, slots, spec, total_samples=2, total_steps=len(slots))
    want = _grads(whole)
    split = Learner(policy, LearnerConfig(loss=loss))
    split.optimizer.zero_grad(set_to_none=True)
    for rows in (slice(0, 1), slice(1, 2)):
        for t in slots:
            split.accumulate(traj, [t], spec, total_samples=2, total_steps=len(slots), rows=rows)
    torch.testing.assert_close(_grads(split), want, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("kind", ["dance-sde", "flow-sde"])
def test_per_sample_draw_trains_each_rows_own_step(kind):
    # slot j with draw_levels trains, on row i, the step trained_steps(...)[i]: the gradient is
    # the sum of the per-row gradients that a per-step spec gives at those steps
    per_sample = SampleSpec(sigmas=sigma_schedule(5, 1.0), sde_steps=(0, 1, 2, 3), kind=kind, seed=7, draw_levels=4)
    per_step = dataclasses.replace(per_sample, draw_levels=0)
    policy = tiny_policy()
    traj = two_sample_batch(policy, per_sample, [1.0, -2.0])
    for loss in ("grpo", "grpo-guard"):
        for slot in range(4):
            steps = trained_steps(per_sample, traj.coords, slot)
            drawn = Learner(policy, LearnerConfig(loss=loss))
            drawn.accumulate(traj, [slot], per_sample, total_samples=2, total_steps=1)
            want = _grads(drawn)
            rowwise = Learner(policy, LearnerConfig(loss=loss))
            rowwise.optimizer.zero_grad(set_to_none=True)
            for i, t in enumerate(steps):
                rowwise.accumulate(traj, [t], per_step, total_samples=2, total_steps=1, rows=slice(i, i + 1))
            torch.testing.assert_close(_grads(rowwise), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
            assert want.abs().max() > 0
            policy.module.zero_grad(set_to_none=True)


# -- DiffusionNFT's old policy (train.nft_decay) ------------------------------------------------
DECAY = dict(loss="nft", nft_decay=0.5, nft_decay_rate=0.25, nft_decay_flat=1)  # d = 0, 0, .25, .5, .5


def _live(learner):
    return {n: p.detach().clone() for n, p in learner.old.params.items()}


def test_old_policy_is_refreshed_on_the_authors_schedule():
    # after the optimizer step that makes version k: old <- d_k old + (1 - d_k) new, with
    # d = 0 below flat 1, then min((k - 1) * 0.25, 0.5): versions 1..4 -> 0, 0.25, 0.5, 0.5
    policy = tiny_policy()
    traj = two_sample_batch(policy, ODE, [1.0, -1.0])
    learner = Learner(policy, LearnerConfig(lr=1e-2, **DECAY))
    for version, d in zip((1, 2, 3, 4), (0.0, 0.25, 0.5, 0.5)):
        before = learner.old.state_dict()
        learner.accumulate(traj, [0], ODE, total_samples=2, total_steps=1)
        metrics = learner.optimizer_step(version=version)
        assert metrics["train/nft_old_decay"] == d
        new = _live(learner)
        for n, old in learner.old.shadow.items():
            torch.testing.assert_close(old, d * before[n] + (1 - d) * new[n], rtol=1e-6, atol=1e-6)
    assert any(not torch.equal(learner.old.shadow[n], new[n]) for n in new)  # the old policy lags
    with pytest.raises(ValueError, match="version"):
        learner.optimizer_step()


def test_swapped_runs_the_old_weights_and_restores_the_live_ones_bit_for_bit():
    policy = tiny_policy()
    learner = Learner(policy, LearnerConfig(**DECAY))
    old = {n: t + 0.01 * torch.randn_like(t) for n, t in learner.old.state_dict().items()}
    learner.old.load_state_dict(old)
    live = _live(learner)
    with learner.sampling_weights():
        assert all(torch.equal(p, old[n]) for n, p in learner.old.params.items())
    assert all(torch.equal(p, live[n]) for n, p in learner.old.params.items())
    assert all(torch.equal(learner.old.shadow[n], old[n]) for n in old)


@pytest.mark.parametrize("nft_beta", [1.0, 0.3])
def test_decayed_old_policy_gives_v_old_and_beta_acts(nft_beta):
    # with an old policy kept, the unit is nft_loss with v_old = the old weights' velocity and
    # the configured beta; the old weights differ from the live ones, so beta changes the gradient
    policy = tiny_policy()
    traj = two_sample_batch(policy, ODE, [2.0, -0.5])
    learner = Learner(policy, LearnerConfig(nft_beta=nft_beta, adv_clip=4.0, **DECAY))
    torch.manual_seed(1)
    old = {n: t + 0.05 * torch.randn_like(t) for n, t in learner.old.state_dict().items()}
    learner.old.load_state_dict(old)
    learner.accumulate(traj, [2], ODE, total_samples=2, total_steps=1)
    got = _grads(learner)
    learner.optimizer.zero_grad(set_to_none=True)

    x0 = traj.latents[:, ODE.num_steps]
    x_t, sigma = forward_targets(x0, ODE, traj.coords, 2)
    reference = tiny_policy()  # the same module, loaded with the old weights by hand
    with torch.no_grad():
        for n, p in reference.module.named_parameters():
            p.copy_(old[n])
        v_old = reference.velocity(x_t, sigma, traj.cond)
    v = policy.velocity(x_t, sigma, traj.cond)
    assert (v - v_old).abs().max() > 1e-3
    loss, _ = nft_loss(v, v_old, x_t, x0, sigma, traj.advantages, beta=nft_beta, adv_clip=4.0)
    loss.backward()
    torch.testing.assert_close(got, _grads(learner), rtol=1e-5, atol=1e-8)
    # and beta acts: the same unit at beta 1 has another gradient
    if nft_beta != 1.0:
        policy.module.zero_grad(set_to_none=True)
        nft_loss(policy.velocity(x_t, sigma, traj.cond), v_old, x_t, x0, sigma, traj.advantages, beta=1.0,
                 adv_clip=4.0)[0].backward()
        assert (_grads(learner) - got).abs().max() > 1e-3 * got.abs().max()

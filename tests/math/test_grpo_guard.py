"""GRPO-Guard's loss (arXiv 2510.22319) against its formulas worked by hand.

    bias  = mean((mean - mean_old)^2) / (2 std^2)
    r_hat = exp(std * (logp - logp_old + bias))
    loss  = mean_B( max(-A r_hat, -A clip(r_hat, 1 - eps, 1 + eps)) / dt )
"""

import math

import pytest
import torch

from digenrl.math import grpo_guard_loss, grpo_loss, sde_step


def test_loss_by_hand():
    # std 0.5, dt 0.25, eps 0.1, two dims per sample (the drift is their mean).
    # unit 1: d = (0.1, 0.3) -> drift (0.01 + 0.09) / 2 = 0.05, bias 0.05 / (2 * 0.25) = 0.1;
    #   log r = 0.2 -> std * (0.2 + 0.1) = 0.15, r_hat = e^0.15 = 1.1618 > 1.1, A = +1:
    #   max(-1.1618, -1.1) = -1.1 (clipped), / dt -> -4.4
    # unit 2: d = (0.2, 0) -> drift 0.02, bias 0.04; log r = -0.44 -> 0.5 * (-0.40) = -0.2,
    #   r_hat = e^-0.2 = 0.8187 < 0.9, A = -1: max(0.8187, 0.9) = 0.9 (clipped), / dt -> 3.6
    # mean over the two units: (-4.4 + 3.6) / 2 = -0.4
    mean_old = torch.zeros(2, 2)
    mean = torch.tensor([[0.1, 0.3], [0.2, 0.0]])
    std = torch.full((2, 1), 0.5)
    logp_old = torch.tensor([-1.0, 2.0])
    logp = logp_old + torch.tensor([0.2, -0.44])
    loss, m = grpo_guard_loss(logp, logp_old, torch.tensor([1.0, -1.0]), mean=mean, mean_old=mean_old, std=std,
                              dt=0.25, clip_range=0.1)
    assert loss.item() == pytest.approx(-0.4, abs=1e-6)
    assert m["loss/clipfrac"].item() == 1.0
    assert m["loss/ratio_mean"].item() == pytest.approx((math.exp(0.15) + math.exp(-0.2)) / 2, rel=1e-6)
    assert m["loss/guard_bias"].item() == pytest.approx((0.1 + 0.04) / 2, rel=1e-6)


def test_gradient_by_hand():
    # One unit inside the clip range, A = +2: loss = -A r_hat / dt, so with n dims
    #   d loss / d logp   = -A r_hat std / dt
    #   d loss / d mean_e = -A r_hat / dt * std * 2 d_e / (n 2 std^2) = -A r_hat d_e / (n std dt)
    std, dt, a = 0.4, 0.2, 2.0
    d = torch.tensor([0.01, -0.02, 0.03])
    logp = torch.tensor([0.05], requires_grad=True)
    mean = d.clone().unsqueeze(0).requires_grad_(True)
    loss, _ = grpo_guard_loss(logp, torch.zeros(1), torch.tensor([a]), mean=mean, mean_old=torch.zeros(1, 3),
                              std=torch.full((1, 1), std), dt=dt, clip_range=0.5)
    loss.backward()
    r_hat = math.exp(std * (0.05 + float((d**2).mean()) / (2 * std**2)))
    assert loss.item() == pytest.approx(-a * r_hat / dt, rel=1e-6)
    assert logp.grad.item() == pytest.approx(-a * r_hat * std / dt, rel=1e-5)
    assert torch.allclose(mean.grad[0], -a * r_hat * d / (3 * std * dt), rtol=1e-5)


@pytest.mark.parametrize("kind", ["flow-sde", "dance-sde"])
def test_ratio_norm_is_the_drift_free_ratio_of_the_gaussian_step(kind):
    # Score x' = mean_old + std * eps under two SDE steps (the behaviour velocity and a
    # moved one): log r = mean(d eps) / std - mean(d^2) / (2 std^2), so RatioNorm gives
    # r_hat = exp(mean(d * eps)) exactly: mean 1 at small d whatever the step's std.
    g = torch.Generator().manual_seed(0)
    x, v_old = torch.randn(3, 4, 5, generator=g), torch.randn(3, 4, 5, generator=g)
    eps = torch.randn(3, 4, 5, generator=g)
    v = v_old + 0.1 * torch.randn(3, 4, 5, generator=g)
    old = sde_step(x, v_old, 0.6, 0.45, kind=kind, noise_level=0.7, noise=eps)
    new = sde_step(x, v, 0.6, 0.45, kind=kind, noise_level=0.7, prev_sample=old.prev_sample)
    _, m = grpo_guard_loss(new.log_prob, old.log_prob, torch.zeros(3), mean=new.mean, mean_old=old.mean,
                           std=new.std, dt=0.15, clip_range=0.1)
    want = torch.exp(((new.mean - old.mean) * eps).mean(dim=(1, 2)))
    assert m["loss/ratio_mean"].item() == pytest.approx(want.mean().item(), rel=1e-5)
    assert m["loss/ratio_max"].item() == pytest.approx(want.max().item(), rel=1e-5)


def test_reduces_to_grpo_at_unit_std_and_step_without_drift():
    # std = 1 and dt = 1 with mean = mean_old (bias 0): r_hat = exp(log r), loss = grpo's
    logp_old = torch.tensor([0.0, 0.3, -0.2])
    adv = torch.tensor([1.0, -1.0, 0.5])
    mean = torch.ones(3, 2)
    lp_a = torch.tensor([0.4, 0.1, -0.25], requires_grad=True)
    lp_b = lp_a.detach().clone().requires_grad_(True)
    guard, mg = grpo_guard_loss(lp_a, logp_old, adv, mean=mean, mean_old=mean, std=torch.ones(3, 1, 1),
                                dt=1.0, clip_range=0.2)
    plain, mp = grpo_loss(lp_b, logp_old, adv, clip_range=0.2)
    guard.backward()
    plain.backward()
    assert guard.item() == pytest.approx(plain.item(), rel=1e-6)
    assert torch.allclose(lp_a.grad, lp_b.grad)
    assert all(mg[k].item() == pytest.approx(mp[k].item(), rel=1e-6) for k in mp)


def test_on_policy_gradient_is_grpos_times_std_over_dt():
    # mean = mean_old and logp = logp_old: both ratios are 1 (no clipping), the bias has zero
    # gradient there, and d r_hat / d logp = std * d r / d logp: the guard gradient is
    # (std / dt) times grpo's, per unit
    std, dt = torch.tensor([0.3, 0.05]), torch.tensor([0.2, 0.1])
    adv = torch.tensor([1.0, -2.0])
    lp_a = torch.tensor([0.1, -0.7], requires_grad=True)
    lp_b = lp_a.detach().clone().requires_grad_(True)
    mean = torch.tensor([[0.5, -0.5], [1.0, 2.0]], requires_grad=True)
    guard, m = grpo_guard_loss(lp_a, lp_a.detach(), adv, mean=mean, mean_old=mean.detach(), std=std, dt=dt,
                               clip_range=1e-4)
    plain, _ = grpo_loss(lp_b, lp_b.detach(), adv, clip_range=1e-4)
    guard.backward()
    plain.backward()
    assert torch.allclose(lp_a.grad, lp_b.grad * std / dt)
    assert torch.equal(mean.grad, torch.zeros_like(mean))
    assert m["loss/ratio_mean"].item() == 1.0 and m["loss/clipfrac"].item() == 0.0


def test_kl_term_adds_beta_times_its_mean():
    # A = 0: the policy term is 0, so the loss is beta * mean(kl) = 0.1 * 1.0
    kl = torch.tensor([0.5, 1.5])
    loss, m = grpo_guard_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), mean=torch.zeros(2, 1),
                              mean_old=torch.zeros(2, 1), std=torch.ones(2), dt=0.5, clip_range=0.1, kl=kl, beta=0.1)
    assert loss.item() == pytest.approx(0.1) and m["loss/kl"].item() == pytest.approx(1.0)


def test_no_statistic_spans_rows():
    # every term is per unit: the loss of a batch is the size-weighted mean of its parts'
    # losses however the rows are cut (what the learner's unit weighting relies on)
    g = torch.Generator().manual_seed(1)
    b = 5
    args = dict(mean=torch.randn(b, 3, generator=g), mean_old=torch.randn(b, 3, generator=g),
                std=torch.rand(b, 1, generator=g) + 0.1, dt=torch.rand(b, generator=g) + 0.05)
    logp, logp_old, adv = (torch.randn(b, generator=g) * 0.1 for _ in range(3))
    whole, _ = grpo_guard_loss(logp, logp_old, adv, clip_range=0.05, **args)
    parts = 0.0
    for rows in (slice(0, 2), slice(2, 5)):
        part, _ = grpo_guard_loss(logp[rows], logp_old[rows], adv[rows], clip_range=0.05,
                                  **{k: v[rows] for k, v in args.items()})
        parts += part * (rows.stop - rows.start) / b
    assert whole.item() == pytest.approx(parts.item(), rel=1e-6)

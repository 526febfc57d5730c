"""Advantage Weighted Matching's loss by hand (math.loss.awm_loss), against the authors' formula:
scxue/advantage_weighted_matching scripts/train_sd3_awm.py:210-252 (the log-likelihood surrogate
-w(sigma) mean((v - (eps - x0))^2)) and :1293-1352 (clipped advantage, PPO-clipped ratio per noise
draw, velocity-MSE KL). Two rows of two elements (B = D = 2) throughout:

    v = [[1, 2], [0, -1]]   target = eps - x0 = [[0, 1], [1, 1]]   sigma = [0.5, 0.25]
    e = mean((v - target)^2) = [(1 + 1) / 2, (1 + 4) / 2] = [1, 2.5]
    A = [2, -10], c = 5, adv_max = 1:  A' = clip(A, -5, 5) / 5 = [0.4, -1]
"""

import math

import pytest
import torch

from digenrl.math import awm_log_likelihood, awm_loss

TARGET = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
SIGMA = torch.tensor([0.5, 0.25])
ADV = torch.tensor([2.0, -10.0])


def _v():
    return torch.tensor([[1.0, 2.0], [0.0, -1.0]], requires_grad=True)


def test_on_policy_loss_and_gradient_are_advantage_weighted_flow_matching():
    # ratio exp(logp - sg(logp)) = 1: loss = mean(-A') = (-0.4 + 1) / 2 = 0.3; d loss / dv =
    # (1/B) (-A') d logp / dv = (1/B) A' 2 (v - target) / D = A' (v - target) / 2
    v = _v()
    loss, m = awm_loss(v, TARGET, SIGMA, ADV, adv_clip=5.0)
    assert loss.item() == pytest.approx(0.3)
    loss.backward()
    torch.testing.assert_close(v.grad, torch.tensor([[0.2, 0.2], [0.5, 1.0]]))
    assert float(m["loss/ratio_mean"]) == 1.0 and float(m["loss/clipfrac"]) == 0.0
    assert float(m["loss/awm_logp"]) == pytest.approx(-(1 + 2.5) / 2)


def test_adv_max_scales_and_the_kl_adds_the_velocity_mse():
    # adv_max 2 doubles A'; KL to v_ref = 0 with weight 0.1: 0.1 * mean([2.5, 0.5]) = 0.15,
    # its gradient 0.1 * 2 v / (B D) = 0.05 v
    v = _v()
    loss, m = awm_loss(v, TARGET, SIGMA, ADV, adv_clip=5.0, adv_max=2.0, v_ref=torch.zeros(2, 2), kl_beta=0.1)
    assert loss.item() == pytest.approx(0.6 + 0.15)
    assert float(m["loss/kl"]) == pytest.approx(1.5)
    loss.backward()
    expect = 2 * torch.tensor([[0.2, 0.2], [0.5, 1.0]]) + 0.05 * torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    torch.testing.assert_close(v.grad, expect)


def test_weightings_scale_the_gradient_as_their_derivative():
    # t: logp = -e sigma -> the uniform gradient times sigma; t2: times sigma^2;
    # ghuber p: logp = -((e + 1e-10)^p - 1e-10^p) sigma / p -> times e^(p - 1) sigma
    uniform = torch.tensor([[0.2, 0.2], [0.5, 1.0]])
    p = 0.25
    e = torch.tensor([1.0, 2.5])
    cases = {"t": SIGMA, "t2": SIGMA**2, "ghuber": e ** (p - 1) * SIGMA}
    for weighting, scale in cases.items():
        v = _v()
        awm_loss(v, TARGET, SIGMA, ADV, adv_clip=5.0, weighting=weighting, ghuber_power=p)[0].backward()
        torch.testing.assert_close(v.grad, uniform * scale[:, None], msg=weighting)
    logp = awm_log_likelihood(_v(), TARGET, SIGMA, weighting="ghuber", ghuber_power=p)
    expect = [-((1 + 1e-10) ** p - 1e-10**p) * 0.5 / p, -((2.5 + 1e-10) ** p - 1e-10**p) * 0.25 / p]
    assert logp.tolist() == pytest.approx(expect)
    with pytest.raises(ValueError, match="huber"):
        awm_log_likelihood(_v(), TARGET, SIGMA, weighting="huber")


def test_off_policy_ratio_is_clipped_as_ppo():
    # logp = [-1, -2.5]; old [-1.5, -2] -> ratio [e^0.5, e^-0.5] = [1.649, 0.607]. Clip 0.2:
    # row 0 (A' 0.4): max(-0.4 * 1.649, -0.4 * 1.2) = -0.48, clipped; row 1 (A' -1):
    # max(0.607, 0.8) = 0.8, clipped. Loss (-0.48 + 0.8) / 2 = 0.16, no gradient, clipfrac 1.
    v = _v()
    loss, m = awm_loss(v, TARGET, SIGMA, ADV, adv_clip=5.0, clip_range=0.2, logp_old=torch.tensor([-1.5, -2.0]))
    assert loss.item() == pytest.approx(0.16)
    assert float(m["loss/clipfrac"]) == 1.0
    loss.backward()
    torch.testing.assert_close(v.grad, torch.zeros(2, 2))
    # inside the band (old = logp + 0.1 -> ratio e^-0.1): the on-policy gradient times the ratio
    v = _v()
    loss, _ = awm_loss(v, TARGET, SIGMA, ADV, adv_clip=5.0, clip_range=0.2, logp_old=torch.tensor([-0.9, -2.4]))
    assert loss.item() == pytest.approx(0.3 * math.exp(-0.1))
    loss.backward()
    torch.testing.assert_close(v.grad, math.exp(-0.1) * torch.tensor([[0.2, 0.2], [0.5, 1.0]]))

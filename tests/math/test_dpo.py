"""Online Diffusion-DPO (arXiv 2311.12908 Eq. 14, in the peers' form) and its pairing,
against the formula worked by hand.

    d    = err - err_ref                 err = mean((v - u)^2), u = (x_t - x0) / sigma
    z    = -beta / 2 (d_w - d_l)
    loss = mean_P( -log sigmoid(z) )
"""

import math

import pytest
import torch

from digenrl.math import dpo_loss, dpo_pairs, flow_matching_error


def test_pairs_best_worst_per_group_and_ties_give_none():
    adv = torch.tensor([0.5, -1.0, 2.0, 0.0, 0.3, 0.3, 1.0, -2.0])
    groups = [0, 0, 0, 1, 1, 1, 2, 2]
    # group 0: best row 2, worst row 1; group 1: rows 4 and 5 tie at the top (lower index wins),
    # worst row 3; group 2: 6 over 7
    assert dpo_pairs(adv, groups, "best-worst") == [(2, 1), (4, 3), (6, 7)]
    assert dpo_pairs(torch.tensor([1.0, 1.0, 0.0, 0.0]), [0, 0, 1, 1], "best-worst") == []


def test_pairs_margin_takes_every_pair_past_it():
    adv = torch.tensor([0.5, -1.0, 2.0, 0.0, 0.3, 0.35])
    groups = [0, 0, 0, 1, 1, 1]
    # group 0 gaps: 2-0 = 1.5, 0-1 = 1.5, 2-1 = 3.0; group 1: 4-3 = 0.3, 5-3 = 0.35, 5-4 = 0.05
    assert dpo_pairs(adv, groups, "margin", 1.0) == [(0, 1), (2, 0), (2, 1)]
    assert dpo_pairs(adv, groups, "margin", 0.32) == [(0, 1), (2, 0), (2, 1), (5, 3)]
    with pytest.raises(ValueError, match="unknown"):
        dpo_pairs(adv, groups, "all")


def test_flow_matching_error_is_the_velocity_target_mse():
    # x0 = 1, eps = -1, sigma = 0.5: x_t = 0.5 - 0.5 = 0, u = eps - x0 = -2; v = -1 -> err = 1
    err = flow_matching_error(torch.tensor([[-1.0, -2.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]]),
                              torch.tensor([0.5]))
    assert err.tolist() == pytest.approx([0.5])  # mean of (1^2, 0^2)


def test_loss_and_gradient_by_hand():
    # Two pairs, beta = 2 (so z = -(d_w - d_l)):
    #   pair 0: err_w 0.3, ref_w 0.5 -> d_w = -0.2; err_l 0.6, ref_l 0.4 -> d_l = 0.2; z = 0.4
    #   pair 1: err_w 0.5, ref_w 0.5 -> d_w = 0;    err_l 0.1, ref_l 0.3 -> d_l = -0.2; z = -0.2
    #   loss = (-log s(0.4) - log s(-0.2)) / 2
    err = torch.tensor([0.3, 0.5, 0.6, 0.1], requires_grad=True)
    err_ref = torch.tensor([0.5, 0.5, 0.4, 0.3])
    loss, m = dpo_loss(err, err_ref, beta=2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert loss.item() == pytest.approx((-math.log(sig(0.4)) - math.log(sig(-0.2))) / 2, rel=1e-6)
    assert m["loss/dpo_implicit_acc"].item() == 0.5 and m["loss/dpo_implicit_margin"].item() == pytest.approx(0.1)
    # dL/derr_w = sigmoid(-z) * beta / 2 / P, dL/derr_l its negative: beta / 2 = 1, P = 2
    loss.backward()
    g0, g1 = sig(-0.4) / 2, sig(0.2) / 2
    assert err.grad.tolist() == pytest.approx([g0, g1, -g0, -g1], rel=1e-6)


def test_gradient_through_the_velocity_by_hand():
    # One pair, one element each, sigma = 1, x0 = 0, x_t = 1 -> u = 1 for both rows;
    # v = (0.5, 2.0), v_ref = (1.0, 1.0): err = (0.25, 1.0), err_ref = (0, 0), d_w - d_l = -0.75
    # beta = 4: z = -2 * -0.75 = 1.5; dL/dv_w = sigmoid(-1.5) * 2 * 2 (v_w - u) = -2 sigmoid(-1.5)
    # and dL/dv_l = -sigmoid(-1.5) * 2 * 2 (v_l - u) = -4 sigmoid(-1.5)
    v = torch.tensor([[0.5], [2.0]], requires_grad=True)
    x_t, x0, sigma = torch.ones(2, 1), torch.zeros(2, 1), torch.ones(2)
    err = flow_matching_error(v, x_t, x0, sigma)
    err_ref = flow_matching_error(torch.ones(2, 1), x_t, x0, sigma)
    loss, _ = dpo_loss(err, err_ref, beta=4.0)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1.5))), rel=1e-6)
    loss.backward()
    s = 1 / (1 + math.exp(1.5))
    assert v.grad.flatten().tolist() == pytest.approx([-2 * s, -4 * s], rel=1e-6)


def test_policy_equal_to_reference_gives_log_two():
    err = torch.tensor([0.7, 0.2, 0.9, 1.3])
    loss, m = dpo_loss(err, err.clone(), beta=100.0)
    assert loss.item() == pytest.approx(math.log(2.0)) and m["loss/dpo_implicit_margin"].item() == 0.0


def test_refuses_an_odd_batch():
    with pytest.raises(ValueError, match="2P rows"):
        dpo_loss(torch.ones(3), torch.ones(3), beta=1.0)

"""DiffusionNFT's loss (arXiv 2509.16117, the authors' train_nft_sd3.py) against its formulas
worked by hand.

    r    = 1/2 + clip(A, -c, c) / (2c)
    x0+  = x_t - s (beta v + (1 - beta) v_old)      x0- = x_t - s ((1 + beta) v_old - beta v)
    loss = c / beta * mean_B( r mean((x0+ - x0)^2) / w+ + (1 - r) mean((x0- - x0)^2) / w- )
           + kl_beta * mean_B( mean((v - v_ref)^2) ),   w = max(mean|x0 -+ - x0|, 1e-5) detached
"""

import pytest
import torch

from digenrl.math import nft_loss, nft_old_decay, nft_optimality


def test_optimality_probability():
    a = torch.tensor([-7.0, -5.0, -2.5, 0.0, 1.0, 5.0, 9.0])
    r = nft_optimality(a, 5.0)
    assert r.tolist() == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.6, 1.0, 1.0])


def test_loss_by_hand_one_element():
    # One element per sample, so w = |e| and e^2 / w = |e|: the loss is c / beta (r |e+| + (1 - r) |e-|).
    # sample 1: x0 = 0.2, x_t = 0.6, s = 0.5, v = 1.0, v_old = 0.2, beta = 0.5, A = 2.5, c = 5 -> r = 0.75
    #   x0+ = 0.6 - 0.5 (0.5 + 0.1) = 0.3 -> e+ = 0.1
    #   x0- = 0.6 - 0.5 (0.3 - 0.5) = 0.7 -> e- = 0.5
    #   term = 5 / 0.5 * (0.75 * 0.1 + 0.25 * 0.5) = 2.0
    # sample 2: x0 = -1, x_t = 0, s = 1, v = 0.5, v_old = 1.5, A = -5 -> r = 0
    #   x0+ = 0 - (0.25 + 0.75) = -1 -> e+ = 0;  x0- = 0 - (2.25 - 0.25) = -2 -> e- = -1
    #   term = 10 * (0 + 1 * 1) = 10
    # mean = 6.0
    v = torch.tensor([[1.0], [0.5]], requires_grad=True)
    v_old = torch.tensor([[0.2], [1.5]])
    x_t = torch.tensor([[0.6], [0.0]])
    x0 = torch.tensor([[0.2], [-1.0]])
    loss, m = nft_loss(v, v_old, x_t, x0, torch.tensor([0.5, 1.0]), torch.tensor([2.5, -5.0]), beta=0.5, adv_clip=5.0)
    assert loss.item() == pytest.approx(6.0, rel=1e-6)
    assert m["loss/nft_r_mean"].item() == pytest.approx(0.375)
    # gradient: w is detached, so d(e^2 / w)/dv = 2 sign(e) de/dv, with de+/dv = -s beta and
    # de-/dv = +s beta; each term weighted c / beta * (r or 1 - r), then the batch mean / 2:
    #   sample 1: (10 * 0.75 * 2 * (-0.25) + 10 * 0.25 * 2 * 0.25) / 2 = (-3.75 + 1.25) / 2 = -1.25
    #   sample 2: (0 + 10 * 1 * 2 * (-1) * 0.5) / 2 = -5
    loss.backward()
    assert v.grad.flatten().tolist() == pytest.approx([-1.25, -5.0], rel=1e-6)


def test_on_policy_gradient_is_reward_weighted_regression_whatever_beta():
    # v_old = v in value: the loss is c / beta mean(|x0_hat - x0|^2) / w and its gradient in v is
    # -2 s A' (x0_hat - x0) / (w D B), A' = clip(A, -c, c), whatever beta.
    g = torch.Generator().manual_seed(0)
    b, d = 3, 8
    x0, eps = torch.randn(b, d, generator=g), torch.randn(b, d, generator=g)
    s = torch.tensor([0.9, 0.5, 0.1])
    x_t = (1 - s[:, None]) * x0 + s[:, None] * eps
    v0 = torch.randn(b, d, generator=g)
    adv = torch.tensor([1.5, -7.0, 0.0])
    x0_hat = x_t - s[:, None] * v0
    w = (x0_hat - x0).abs().mean(dim=1, keepdim=True)
    expected = -2 * s[:, None] * adv.clamp(-5, 5)[:, None] * (x0_hat - x0) / (w * d * b)
    for beta in (0.1, 1.0, 2.0):
        v = v0.clone().requires_grad_(True)
        loss, _ = nft_loss(v, v.detach(), x_t, x0, s, adv, beta=beta, adv_clip=5.0)
        assert loss.item() == pytest.approx((5.0 / beta * ((x0_hat - x0) ** 2 / w).mean(dim=1)).mean().item(), rel=1e-5)
        loss.backward()
        torch.testing.assert_close(v.grad, expected, rtol=1e-5, atol=1e-7)
    # A = 0 (r = 1/2) pushes nothing on-policy
    assert expected[2].abs().max() == 0


def test_kl_is_the_velocity_mse_to_the_reference():
    v = torch.tensor([[1.0, 2.0], [0.0, 0.0]], requires_grad=True)
    v_ref = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    x = torch.zeros(2, 2)
    base, _ = nft_loss(v, v.detach(), x, x, torch.ones(2), torch.zeros(2), beta=1.0, adv_clip=5.0)
    loss, m = nft_loss(v, v.detach(), x, x, torch.ones(2), torch.zeros(2), beta=1.0, adv_clip=5.0,
                       v_ref=v_ref, kl_beta=0.1)
    # per sample mean((v - v_ref)^2): (1 + 4) / 2 = 2.5 and 1, mean 1.75
    assert m["loss/kl"].item() == pytest.approx(1.75)
    assert (loss - base).item() == pytest.approx(0.175, rel=1e-5)


def test_rows_are_independent():
    # splitting a batch into units changes no row's term: the sum of the parts' row-weighted
    # losses is the whole batch's loss
    g = torch.Generator().manual_seed(1)
    v, v_old, x_t, x0 = (torch.randn(4, 6, generator=g) for _ in range(4))
    s, adv = torch.rand(4, generator=g), torch.randn(4, generator=g) * 3
    whole, _ = nft_loss(v, v_old, x_t, x0, s, adv, beta=0.7, adv_clip=2.0)
    parts = sum(nft_loss(v[i:j], v_old[i:j], x_t[i:j], x0[i:j], s[i:j], adv[i:j], beta=0.7, adv_clip=2.0)[0] * (j - i)
                for i, j in ((0, 1), (1, 4)))
    assert whole.item() == pytest.approx(parts.item() / 4, rel=1e-6)


def test_old_policy_decay_is_the_authors_return_decay():
    # return_decay (NVlabs/DiffusionNFT scripts/train_nft_sd3.py:169-189), worked by hand:
    # type 1 (flat 0, rate 0.001, ceiling 0.5): k = 0, 1, 300, 500, 900 -> 0, 0.001, 0.3, 0.5, 0.5
    assert [nft_old_decay(k, 0.5, 0.001, 0) for k in (0, 1, 300, 500, 900)] == pytest.approx([0, 0.001, 0.3, 0.5, 0.5])
    # type 2 (flat 75, rate 0.0075, ceiling 0.999): k = 74 -> 0; 75 -> 0; 100 -> 25 * 0.0075 = 0.1875;
    # 208 -> 133 * 0.0075 = 0.9975; 209 -> 1.005, held at 0.999
    assert [nft_old_decay(k, 0.999, 0.0075, 75) for k in (74, 75, 100, 208, 209)] == pytest.approx(
        [0, 0, 0.1875, 0.9975, 0.999])


def test_gradient_depends_on_beta_once_the_old_policy_differs():
    # v_old != v: x0+- move with beta, so the gradient does (the on-policy case above does not)
    x_t, x0, s = torch.tensor([[0.6, -0.2]]), torch.tensor([[0.2, 0.1]]), torch.tensor([0.5])
    grads = []
    for beta in (1.0, 0.1):
        v = torch.tensor([[1.0, 0.3]], requires_grad=True)
        nft_loss(v, torch.tensor([[0.2, 0.4]]), x_t, x0, s, torch.tensor([2.5]), beta=beta, adv_clip=5.0)[0].backward()
        grads.append(v.grad.clone())
    assert (grads[0] - grads[1]).abs().max() > 1e-2

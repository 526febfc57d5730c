"""Flow-DPPO (arXiv 2606.11025; veRL-Omni FlowDPPOLoss, UniRL _flowdppo_kl_adv_loss) against
its formula worked by hand:

    D    = mean((mean - mean_old)^2) / (2 std^2)
    drop = D >= threshold and ((A > 0 and r > 1) or (A < 0 and r < 1))
    loss = mean_B( -A r where not drop, else 0 )
"""

import math

import pytest
import torch

from digenrl.math import flow_dppo_loss, grpo_loss


def test_mask_loss_and_gradient_by_hand():
    # std = 0.5 -> 2 std^2 = 0.5; one element per unit, so D = (mean - mean_old)^2 / 0.5
    #   unit 0: A =  1, log r =  0.1, d = 0.1  -> D = 0.02 >= 0.01, r > 1, A > 0: dropped
    #   unit 1: A = -1, log r =  0.1, d = 0.1  -> D = 0.02, r > 1 but A < 0: kept (corrective)
    #   unit 2: A = -2, log r = -0.2, d = 0.05 -> D = 0.005 < 0.01: kept
    #   unit 3: A = -1, log r = -0.1, d = 0.2  -> D = 0.08, r < 1, A < 0: dropped
    logp_old = torch.zeros(4)
    logp = torch.tensor([0.1, 0.1, -0.2, -0.1], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -2.0, -1.0])
    mean_old = torch.zeros(4, 1)
    mean = torch.tensor([[0.1], [0.1], [0.05], [0.2]], requires_grad=True)
    std = torch.full((4, 1), 0.5)
    loss, m = flow_dppo_loss(logp, logp_old, adv, mean=mean, mean_old=mean_old, std=std, threshold=0.01)
    r = [math.exp(x) for x in (0.1, 0.1, -0.2, -0.1)]
    assert loss.item() == pytest.approx((0 + r[1] + 2 * r[2] + 0) / 4, rel=1e-6)
    assert m["loss/dppo_masked_frac"].item() == 0.5 and m["loss/dppo_high_frac"].item() == 0.75
    assert m["loss/dppo_divergence_max"].item() == pytest.approx(0.08, rel=1e-5)
    loss.backward()
    # d(-A r)/dlogp = -A r on kept units, 0 on dropped; mean over 4; no gradient through the mask or the mean
    assert logp.grad.tolist() == pytest.approx([0.0, r[1] / 4, 2 * r[2] / 4, 0.0], rel=1e-6)
    assert mean.grad is None or bool((mean.grad == 0).all())


def test_threshold_is_inclusive():
    # D exactly at the threshold is past it (veRL-Omni: kl_per_sample >= kl_mask_threshold)
    loss, m = flow_dppo_loss(torch.tensor([0.1]), torch.zeros(1), torch.ones(1), mean=torch.tensor([[0.5]]),
                             mean_old=torch.zeros(1, 1), std=torch.ones(1, 1), threshold=0.125)
    assert m["loss/dppo_masked_frac"].item() == 1.0 and loss.item() == 0.0


def test_on_policy_gradient_is_grpo_s():
    # mean = mean_old and ratio 1: D = 0, nothing dropped; the gradient equals grpo_loss's
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(5, generator=g)
    mean = torch.randn(5, 3, generator=g)
    logp_a = torch.zeros(5, requires_grad=True)
    logp_b = torch.zeros(5, requires_grad=True)
    la, m = flow_dppo_loss(logp_a, torch.zeros(5), adv, mean=mean, mean_old=mean.clone(), std=torch.ones(5, 1, 1),
                           threshold=1e-5)
    lb, _ = grpo_loss(logp_b, torch.zeros(5), adv, clip_range=1e-4)
    la.backward()
    lb.backward()
    assert m["loss/dppo_masked_frac"].item() == 0.0
    assert torch.allclose(logp_a.grad, logp_b.grad) and la.item() == pytest.approx(lb.item())

"""The rollout-train gap and its corrections on hand-made tensors, expected numbers by hand."""

import math

import pytest
import torch

from digenrl.math import grpo_loss, logp_gap_metrics, rollout_correction


def test_gap_metrics_by_hand():
    # gaps logp_train - logp_rollout = (0, 0.1, -0.3, 0.02); clip_range 0.05:
    # |exp(gap) - 1| = 0, 0.105, 0.259, 0.0202 -> rows 2 and 3 past the clip range: 2/4
    rollout = torch.tensor([-1.0, -2.0, 0.5, 0.0])
    train = rollout + torch.tensor([0.0, 0.1, -0.3, 0.02])
    m = logp_gap_metrics(rollout, train, clip_range=0.05)
    assert m["consistency/gap_mean"].item() == pytest.approx((0.1 - 0.3 + 0.02) / 4, abs=1e-6)
    assert m["consistency/gap_abs_mean"].item() == pytest.approx((0.1 + 0.3 + 0.02) / 4, abs=1e-6)
    assert m["consistency/gap_abs_max"].item() == pytest.approx(0.3, abs=1e-6)
    assert m["consistency/past_clip"].item() == pytest.approx(0.5)
    same = logp_gap_metrics(rollout, rollout.clone(), clip_range=1e-4)
    assert all(v.item() == 0.0 for v in same.values())


def test_truncated_and_mask_weights_by_hand():
    # w = pi_train / pi_rollout = exp(gap) for gaps log(3), log(1.5), log(0.25), 0; band C = 2
    # truncated: min(w, 2)          = 2, 1.5, 0.25, 1
    # mask:      1 if 1/2 <= w <= 2 = 0, 1,   0,    1
    rollout = torch.zeros(4)
    train = torch.tensor([math.log(3.0), math.log(1.5), math.log(0.25), 0.0])
    w, m = rollout_correction(train, rollout, "truncated", 2.0)
    assert torch.allclose(w, torch.tensor([2.0, 1.5, 0.25, 1.0]))
    assert m["consistency/is_weight_mean"].item() == pytest.approx((2 + 1.5 + 0.25 + 1) / 4)
    assert m["consistency/is_outside_band"].item() == pytest.approx(0.5)
    w, m = rollout_correction(train, rollout, "mask", 2.0)
    assert torch.equal(w, torch.tensor([0.0, 1.0, 0.0, 1.0]))
    assert m["consistency/is_weight_mean"].item() == pytest.approx(0.5)
    w, _ = rollout_correction(train, rollout, "none", 2.0)
    assert torch.equal(w, torch.ones(4))
    with pytest.raises(ValueError, match="is_band"):
        rollout_correction(train, rollout, "mask", 1.0)
    with pytest.raises(ValueError, match="truncated"):
        rollout_correction(train, rollout, "clip", 2.0)


def test_weighted_loss_and_gradient_by_hand():
    # recompute: logp_old = logp (detached) -> ratio 1, nothing clipped; rows weighted by w_is:
    # loss = mean(-A_i w_i), d loss / d logp_i = -A_i w_i / B
    # A = (1, -2, 0.5), w_is = (2, 0, 0.25) -> loss = (-2 + 0 - 0.125) / 3
    logp = torch.tensor([-1.0, -0.5, 0.3], requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 0.5])
    w_is = torch.tensor([2.0, 0.0, 0.25])
    loss, m = grpo_loss(logp, logp.detach(), adv, clip_range=1e-4, is_weights=w_is)
    assert loss.item() == pytest.approx((-2.0 - 0.125) / 3)
    loss.backward()
    assert torch.allclose(logp.grad, -adv * w_is / 3)
    assert m["loss/clipfrac"].item() == 0.0
    # without weights it is grpo_loss as before
    plain, _ = grpo_loss(logp.detach(), logp.detach(), adv, clip_range=1e-4)
    assert plain.item() == pytest.approx(-(1.0 - 2.0 + 0.5) / 3)

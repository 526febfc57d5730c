"""Advantages and the clipped loss, with expected numbers derived by hand."""

import pytest
import torch

from digenrl.math import SdeWindow, combine_rewards, gaussian_mean_kl, group_advantages, grpo_loss


def test_group_advantages_by_hand():
    # group 0: rewards 1, 3 -> mean 2, population std 1 -> A = -1, +1 (eps 0)
    # group 1: rewards 2, 2, 5 -> mean 3, var (1+1+4)/3 = 2 -> A = -1/sqrt2, -1/sqrt2, 2/sqrt2
    r = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0])
    g = torch.tensor([0, 0, 7, 7, 7])
    a = group_advantages(r, g, eps=0.0)
    s2 = 2**0.5
    assert torch.allclose(a, torch.tensor([-1.0, 1.0, -1 / s2, -1 / s2, 2 / s2]))


def test_global_std_and_none():
    r = torch.tensor([1.0, 3.0, 2.0, 4.0])
    g = torch.tensor([0, 0, 1, 1])
    # centred: -1, 1, -1, 1; global population std of r = sqrt(1.25)
    assert torch.allclose(group_advantages(r, g, std="global", eps=0.0), torch.tensor([-1.0, 1, -1, 1]) / 1.25**0.5)
    assert torch.allclose(group_advantages(r, g, std="none"), torch.tensor([-1.0, 1, -1, 1]))


def test_equal_rewards_give_zero_advantage_and_clip_applies():
    assert torch.equal(group_advantages(torch.ones(4), torch.zeros(4)), torch.zeros(4))
    a = group_advantages(torch.tensor([0.0, 100.0]), torch.tensor([0, 0]), std="none", clip=5.0)
    assert torch.equal(a, torch.tensor([-5.0, 5.0]))


def test_advantages_do_not_depend_on_sample_order():
    r = torch.tensor([0.1, 0.5, 0.9, 0.3, 0.7, 0.2])
    g = torch.tensor([0, 1, 0, 1, 0, 1])
    perm = torch.tensor([5, 3, 1, 0, 2, 4])
    assert torch.allclose(group_advantages(r, g)[perm], group_advantages(r[perm], g[perm]))


def test_combine_rewards():
    r = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([10.0, 30.0])}
    assert torch.allclose(combine_rewards(r, {"a": 1.0, "b": 0.5}), torch.tensor([6.0, 17.0]))
    # gdpo: each reward becomes a group advantage (-1, +1) before weighting
    n = combine_rewards(r, {"a": 1.0, "b": 0.5}, aggregate="gdpo", group_ids=torch.tensor([0, 0]), eps=0.0)
    assert torch.allclose(n, torch.tensor([-1.5, 1.5]))
    with pytest.raises(ValueError, match="not computed"):
        combine_rewards(r, {"c": 1.0})
    with pytest.raises(ValueError, match="group_ids"):
        combine_rewards(r, {"a": 1.0}, aggregate="gdpo")


def test_gdpo_keeps_distinct_reward_combinations_apart_by_hand():
    # GDPO's example (arXiv 2601.05242, sec. 3): two binary rewards, two groups of two.
    # group 0: (r1, r2) = (1, 0), (0, 0)   group 1: (1, 1), (0, 0)
    # sum then GRPO: totals (1, 0) and (2, 0) both standardise to (+1, -1): the groups collapse.
    # gdpo: group 0: r1 -> (+1, -1), r2 constant -> (0, 0): sum (+1, -1)
    #       group 1: r1 -> (+1, -1), r2 -> (+1, -1):          sum (+2, -2)
    # then adv_std=global: batch std of (1, -1, 2, -2) = sqrt(10/4) -> (1, -1, 2, -2) / sqrt(2.5)
    r = {"r1": torch.tensor([1.0, 0.0, 1.0, 0.0]), "r2": torch.tensor([0.0, 0.0, 1.0, 0.0])}
    w, g = {"r1": 1.0, "r2": 1.0}, torch.tensor([0, 0, 1, 1])
    grpo = group_advantages(combine_rewards(r, w), g, eps=0.0)
    assert torch.allclose(grpo, torch.tensor([1.0, -1.0, 1.0, -1.0]))
    total = combine_rewards(r, w, aggregate="gdpo", group_ids=g, eps=1e-9)  # (eps 0: 0 / 0 for constant r2)
    assert torch.allclose(total, torch.tensor([1.0, -1.0, 2.0, -2.0]))
    adv = group_advantages(total, g, std="global", eps=0.0)
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 2.0, -2.0]) / 2.5**0.5)


def test_clipped_loss_by_hand():
    # eps = 0.2. Sample 1: A=+1, ratio 1.5 -> min(1.5, 1.2) objective = 1.2 -> loss -1.2 (clipped)
    # Sample 2: A=-1, ratio 0.5 -> objective min(-0.5, -0.8) = -0.8 -> loss +0.8 (clipped)
    # Sample 3: A=+2, ratio 0.9 -> objective min(1.8, 1.8) = 1.8 -> loss -1.8 (inside)
    ratio = torch.tensor([1.5, 0.5, 0.9])
    logp_old = torch.zeros(3)
    logp = ratio.log()
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, m = grpo_loss(logp, logp_old, adv, clip_range=0.2)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.8) / 3)
    assert m["loss/clipfrac"].item() == pytest.approx(2 / 3)
    assert m["loss/ratio_mean"].item() == pytest.approx(ratio.mean().item())


def test_unclipped_side_keeps_gradient():
    # A = +1 and ratio below 1 - eps: the unclipped term is the max of the losses, grad flows
    logp = torch.tensor([-0.5], requires_grad=True)
    loss, _ = grpo_loss(logp, torch.zeros(1), torch.ones(1), clip_range=0.2)
    loss.backward()
    assert logp.grad.item() == pytest.approx(-torch.exp(torch.tensor(-0.5)).item())


def test_kl_has_gradient_and_closed_form():
    mean = torch.tensor([[1.0, 2.0]], requires_grad=True)
    ref = torch.tensor([[0.0, 0.0]])
    std = torch.tensor([[2.0]])
    kl = gaussian_mean_kl(mean, ref, std)
    # ((1)^2 + (2)^2) / (2 * 4) / 2 dims = 5/16
    assert kl.item() == pytest.approx(5 / 16)
    loss, m = grpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), clip_range=0.2, kl=kl, beta=0.5)
    loss.backward()
    assert mean.grad is not None and mean.grad.abs().sum() > 0
    assert m["loss/kl"].item() == pytest.approx(5 / 16)


def test_sde_windows():
    assert SdeWindow("all-but-last").select(5, 0, 0) == ([0, 1, 2, 3], [0, 1, 2, 3])
    # first: the same high-noise steps at every RL step
    assert [SdeWindow("first", size=3).select(10, 0, k) for k in (0, 7)] == [([0, 1, 2], [0, 1, 2])] * 2
    with pytest.raises(ValueError, match="longer"):
        SdeWindow("first", size=5).validate(5)
    sde, trained = SdeWindow("contiguous", size=2).select(10, 0, 3)
    assert sde == trained and len(sde) == 2 and sde[1] == sde[0] + 1 and sde[1] <= 8
    assert SdeWindow("contiguous", size=2).select(10, 0, 3) == (sde, trained)  # pure function
    # sliding: start moves by stride every `every` steps, wrapping over the 9 - 3 + 1 = 7 positions
    w = SdeWindow("sliding", size=3, stride=2, every=5)
    assert w.select(10, 0, 0)[0] == [0, 1, 2] and w.select(10, 0, 5)[0] == [2, 3, 4]
    assert w.select(10, 0, 20)[0] == [1, 2, 3]  # (4 * 2) % 7 = 1
    sde, trained = SdeWindow("fraction", fraction=0.5).select(9, 0, 0)
    assert sde == list(range(8)) and len(trained) == 4 and set(trained) <= set(sde)
    with pytest.raises(ValueError, match="longer"):
        SdeWindow("contiguous", size=9).validate(9)

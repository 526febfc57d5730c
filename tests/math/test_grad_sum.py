"""GradSum: an RL step's gradient summed over its units in an order-free way (train.grad_sum)."""

import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.math.grad_sum import AUTO_FLOAT64_PARAMS, GradSum, grad_sum_bytes, resolve_grad_sum


def _sum_in_order(grads: list[torch.Tensor], order: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Backward passes leaving grads[i] in the order given; returns p.grad after the last."""
    p = torch.nn.Parameter(torch.zeros(grads[0].shape))
    acc = GradSum([p], dtype)
    for i in order:
        acc.before_backward()
        (p * grads[i]).sum().backward()  # d/dp = grads[i]
        acc.fold()
    return p.grad.clone()


def test_float64_sums_do_not_depend_on_the_order_float32_ones_do():
    g = torch.Generator().manual_seed(0)
    # units of very different sizes, as a weighted loss makes them: float32 sums then round
    grads = [torch.randn(4096, generator=g) * 10.0 ** float(torch.randint(-6, 2, (1,), generator=g)) for _ in range(64)]
    orders = [torch.randperm(64, generator=g).tolist() for _ in range(4)]
    wide = [_sum_in_order(grads, o, torch.float64) for o in orders]
    narrow = [_sum_in_order(grads, o, torch.float32) for o in orders]
    assert all(torch.equal(wide[0], w) for w in wide[1:])  # the same float32 gradient for every order
    assert any(not torch.equal(narrow[0], n) for n in narrow[1:])  # what float64 sums fix
    exact = torch.stack([x.double() for x in grads]).sum(0)
    assert torch.equal(wide[0], exact.float())  # and it is the correctly rounded sum


def test_p_grad_holds_the_sum_so_far_and_untouched_parameters_stay_none():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    acc = GradSum([a, b], torch.float64)
    for scale in (1.0, 2.0):
        acc.before_backward()
        (scale * a).sum().backward()
        acc.fold()
    assert torch.equal(a.grad, torch.full((3,), 3.0)) and a.grad.dtype == torch.float32
    assert b.grad is None and acc.touched() == [True, False]
    assert acc.local_sums()[0].dtype == torch.float64
    acc.set_local_sum(0, torch.full((3,), 5.0, dtype=torch.float64))  # after an all-reduce
    assert torch.equal(a.grad, torch.full((3,), 5.0))
    acc.clear()
    assert acc.touched() == [False, False]


def test_float32_leaves_autograd_alone():
    p = torch.nn.Parameter(torch.ones(2))
    acc = GradSum([p], torch.float32)
    for _ in range(2):
        acc.before_backward()  # a no-op: autograd accumulates
        p.sum().backward()
        acc.fold()
    assert torch.equal(p.grad, torch.full((2,), 2.0)) and acc.local_sums()[0] is p.grad


def test_auto_picks_float64_for_small_trainable_sets_and_the_key_is_checked():
    assert resolve_grad_sum("auto", AUTO_FLOAT64_PARAMS) == torch.float64
    assert resolve_grad_sum("auto", AUTO_FLOAT64_PARAMS + 1) == torch.float32
    assert resolve_grad_sum("float32", 10) == torch.float32 and grad_sum_bytes("float64", 10**10) == 8
    assert load_config(None, ["train.grad_sum=float32"]).train.grad_sum == "float32"
    with pytest.raises(ConfigError, match="train.grad_sum.*auto, float64, float32"):
        load_config(None, ["train.grad_sum=float16"])

"""SDE steps against their closed forms (the convention: digenrl/math/sde.py)."""

import math

import pytest
import torch

from digenrl.math import sde_step, sigma_schedule


@pytest.fixture
def xv():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 4, 4, generator=g)
    v = torch.randn(3, 2, 4, 4, generator=g)
    return x, v


def test_sigma_schedule_endpoints_and_shift():
    s = sigma_schedule(4)
    assert torch.allclose(s, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    # shift 3 at s = 0.5: 3 * 0.5 / (1 + 2 * 0.5) = 0.75
    assert sigma_schedule(2, shift=3.0)[1].item() == pytest.approx(0.75)
    assert sigma_schedule(4, 3.0)[0] == 1.0 and sigma_schedule(4, 3.0)[-1] == 0.0


def test_ode_is_the_euler_step(xv):
    x, v = xv
    out = sde_step(x, v, 0.8, 0.6, kind="ode", noise_level=0.7)
    assert torch.allclose(out.prev_sample, x - 0.2 * v)
    assert out.log_prob is None


def test_flow_sde_mean_and_std(xv):
    x, v = xv
    s, sn, a = 0.6, 0.4, 0.7
    d = s - sn
    g = a * math.sqrt(s / (1 - s))
    out = sde_step(x, v, s, sn, kind="flow-sde", noise_level=a, generator=torch.Generator().manual_seed(1))
    mean = x * (1 - g**2 * d / (2 * s)) - d * v * (1 + g**2 * (1 - s) / (2 * s))
    assert torch.allclose(out.mean, mean, atol=1e-6)
    assert torch.allclose(out.std, torch.full_like(out.std, g * math.sqrt(d)))


def test_flow_sde_at_sigma_one_uses_one_minus_sigma_next(xv):
    x, v = xv
    out = sde_step(x, v, 1.0, 0.9, kind="flow-sde", noise_level=0.7, generator=torch.Generator().manual_seed(1))
    g = 0.7 * math.sqrt(1.0 / (1 - 0.9))
    assert out.std.flatten()[0].item() == pytest.approx(g * math.sqrt(0.1), rel=1e-5)
    assert torch.isfinite(out.log_prob).all()


def test_dance_sde_mean_and_std(xv):
    x, v = xv
    s, sn, eta = 0.5, 0.3, 0.3
    d = s - sn
    out = sde_step(x, v, s, sn, kind="dance-sde", noise_level=eta, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(out.mean, x - d * (v + eta**2 / (2 * s) * (x + (1 - s) * v)), atol=1e-6)
    assert out.std.flatten()[0].item() == pytest.approx(eta * math.sqrt(d), rel=1e-6)


def test_cps_mean_std_and_surrogate(xv):
    x, v = xv
    s, sn, a = 0.5, 0.3, 0.7
    std = sn * math.sin(a * math.pi / 2)
    x0, x1 = x - s * v, x + (1 - s) * v
    out = sde_step(x, v, s, sn, kind="cps", noise_level=a, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(out.mean, (1 - sn) * x0 + math.sqrt(sn**2 - std**2) * x1, atol=1e-6)
    assert out.std.flatten()[0].item() == pytest.approx(std, rel=1e-6)
    assert torch.allclose(out.log_prob, -((out.prev_sample - out.mean) ** 2).mean(dim=(1, 2, 3)))


@pytest.mark.parametrize("kind", ["flow-sde", "dance-sde"])
def test_log_prob_is_normal_log_prob_averaged_over_dims(xv, kind):
    x, v = xv
    out = sde_step(x, v, 0.7, 0.5, kind=kind, noise_level=0.5, generator=torch.Generator().manual_seed(2))
    ref = torch.distributions.Normal(out.mean, out.std.expand_as(out.mean)).log_prob(out.prev_sample)
    assert torch.allclose(out.log_prob, ref.mean(dim=(1, 2, 3)), atol=1e-5)


def test_scoring_a_given_sample_reproduces_its_log_prob(xv):
    x, v = xv
    a = sde_step(x, v, 0.7, 0.5, kind="flow-sde", noise_level=0.7, generator=torch.Generator().manual_seed(3))
    b = sde_step(x, v, 0.7, 0.5, kind="flow-sde", noise_level=0.7, prev_sample=a.prev_sample)
    assert torch.equal(a.log_prob, b.log_prob)


def test_per_sample_sigmas_match_scalar_sigmas(xv):
    x, v = xv
    noise = torch.randn_like(x)
    a = sde_step(x, v, 0.7, 0.5, kind="flow-sde", noise_level=0.7, noise=noise)
    b = sde_step(x, v, torch.full((3,), 0.7), torch.full((3,), 0.5), kind="flow-sde", noise_level=0.7, noise=noise)
    assert torch.allclose(a.prev_sample, b.prev_sample) and torch.allclose(a.log_prob, b.log_prob)


def test_math_is_float32_for_bf16_inputs(xv):
    x, v = xv
    out = sde_step(x.bfloat16(), v.bfloat16(), 0.7, 0.5, kind="flow-sde", noise_level=0.7,
                   generator=torch.Generator().manual_seed(0))
    assert out.log_prob.dtype == torch.float32 and out.prev_sample.dtype == torch.float32


def test_bad_inputs_are_named():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown"):
        sde_step(x, x, 0.5, 0.4, kind="ddim", noise_level=0.7)
    with pytest.raises(ValueError, match="smaller"):
        sde_step(x, x, 0.4, 0.5, kind="ode", noise_level=0.7)

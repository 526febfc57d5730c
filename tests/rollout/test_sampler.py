"""The sampler's one-step hook: `advance` is a loop of `denoise_step`, re-runnable in place."""

from __future__ import annotations

import pytest
import torch

from digenrl.math import sigma_schedule
from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig, TinyDiTPolicy
from digenrl.rollout import SampleSpec, advance, denoise_step, start


def _policy() -> TinyDiTPolicy:
    torch.manual_seed(0)
    module = TinyDiT(TinyDiTConfig(image_size=8, dim=32, depth=1, heads=2))
    # adaLN-zero starts every block as the identity: perturb the modulation so v depends on cond
    for p in module.parameters():
        p.data.add_(0.02 * torch.randn_like(p))
    return TinyDiTPolicy(module)


def _start(policy, spec):
    prompts = ["a red circle", "a blue square", "a red circle"]
    coords = [(0, 0, 0), (0, 0, 1), (0, 1, 0)]
    return start(policy, prompts, coords, spec, step=0, version=0)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
def test_advance_equals_a_loop_of_denoise_steps(cfg_scale):
    policy = _policy()
    spec = SampleSpec(sigmas=sigma_schedule(4, 1.0), sde_steps=(0, 2), cfg_scale=cfg_scale, seed=7)
    ref = advance(policy, _start(policy, spec), spec)

    traj = _start(policy, spec)
    for t in range(spec.num_steps):
        denoise_step(policy, traj, spec, t)
    assert traj.t_done == 0  # the hook leaves the step counter to advance
    assert torch.equal(traj.latents, ref.latents)
    torch.testing.assert_close(traj.log_probs, ref.log_probs, rtol=0, atol=0, equal_nan=True)
    # ODE steps keep NaN log-probs, SDE steps get finite ones
    assert torch.isnan(traj.log_probs[:, [1, 3]]).all() and torch.isfinite(traj.log_probs[:, [0, 2]]).all()


def test_denoise_step_reruns_to_the_same_values():
    policy = _policy()
    spec = SampleSpec(sigmas=sigma_schedule(3, 1.0), sde_steps=(1,), seed=3)
    traj = advance(policy, _start(policy, spec), spec, t_end=2)
    x2, logp1 = traj.latents[:, 2].clone(), traj.log_probs[:, 1].clone()
    denoise_step(policy, traj, spec, 1)  # the noise is a function of (seed, coords, t): same draw again
    assert torch.equal(traj.latents[:, 2], x2) and torch.equal(traj.log_probs[:, 1], logp1)


def test_denoise_step_rejects_steps_outside_the_schedule():
    policy = _policy()
    spec = SampleSpec(sigmas=sigma_schedule(3, 1.0), sde_steps=(0,))
    traj = _start(policy, spec)
    with pytest.raises(ValueError, match="out of range"):
        denoise_step(policy, traj, spec, 3)


def _recording(policy: TinyDiTPolicy) -> list[torch.Tensor]:
    """Wrap policy.velocity so that every sigma the model is conditioned on is kept."""
    seen, velocity = [], policy.velocity

    def spy(x, sigma, cond):
        seen.append(sigma.detach().clone())
        return velocity(x, sigma, cond)

    policy.velocity = spy
    return seen


def test_floored_model_timestep_conditions_the_model_and_not_the_sde():
    """sampling.model_timestep=floor (DanceGRPO): the model sees int(sigma * 1000) / 1000, the
    SDE step the exact sigma; the learner conditions the same way, so the on-policy ratio is 1."""
    from digenrl.learner import Learner, LearnerConfig
    from digenrl.math import sde_step
    from digenrl.rollout.sampler import sde_noise

    policy = _policy()
    # shift 3 on 5 steps: sigma[1] = 12/13 = 0.92308, which the model sees as 0.923
    spec = SampleSpec(sigmas=sigma_schedule(5, 3.0), sde_steps=(0, 1, 2), kind="dance-sde", noise_level=0.3,
                      seed=3, model_timestep="floor")
    sigma = spec.sigmas[1]
    floored = torch.floor(sigma * 1000.0) / 1000.0
    assert float(floored) != float(sigma)  # the case is not vacuous: flooring moves this sigma
    traj = _start(policy, spec)
    denoise_step(policy, traj, spec, 0)
    seen = _recording(policy)
    denoise_step(policy, traj, spec, 1)
    assert torch.equal(seen[-1], floored.expand(3))  # the model saw the floored timestep

    # the step itself is the SDE at the exact sigma with that velocity (and not at the floored one)
    with torch.no_grad():
        v = TinyDiTPolicy.velocity(policy, traj.latents[:, 1], floored.expand(3), traj.cond)
    noise = sde_noise(policy.latent_shape, spec, traj.coords, 1)
    exact = sde_step(traj.latents[:, 1], v, sigma.item(), spec.sigmas[2].item(), kind="dance-sde",
                     noise_level=0.3, noise=noise)
    torch.testing.assert_close(traj.latents[:, 2], exact.prev_sample, rtol=0, atol=1e-6)
    off = sde_step(traj.latents[:, 1], v, floored.item(), spec.sigmas[2].item(), kind="dance-sde",
                   noise_level=0.3, noise=noise)
    assert (traj.latents[:, 2] - off.prev_sample).abs().max() > 1e-4
    # and the floor reached the model: its velocity at the exact sigma is another one
    with torch.no_grad():
        v_exact = TinyDiTPolicy.velocity(policy, traj.latents[:, 1], sigma.expand(3), traj.cond)
    assert (v - v_exact).abs().max() > 1e-6

    # the learner re-scores the step under the same conditioning: ratio 1 exactly
    traj = advance(policy, traj, spec)
    learner = Learner(policy, LearnerConfig())
    out = learner.score(traj, 1, spec)
    assert torch.equal(seen[-1], floored.expand(3))
    torch.testing.assert_close(out.log_prob, traj.log_probs[:, 1], rtol=0, atol=0)


def test_exact_model_timestep_is_sigma_itself():
    policy = _policy()
    spec = SampleSpec(sigmas=sigma_schedule(4, 3.0), sde_steps=(0,), seed=3)
    traj = _start(policy, spec)
    seen = _recording(policy)
    denoise_step(policy, traj, spec, 1)
    assert torch.equal(seen[-1], spec.sigmas[1].expand(3))

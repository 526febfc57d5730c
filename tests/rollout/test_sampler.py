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

"""Wan2.2's per-expert guidance: `sampling.cfg_scale` for the high-noise expert and
`sampling.cfg_scale_low` for the low-noise one (diffusers' guidance_scale / guidance_scale_2).

On the tiny two-expert pipeline of test_new_families.py (CPU, float32): the guided ODE
reproduces WanPipeline's own latents with guidance_scale 4, guidance_scale_2 3 and differs
from a one-scale run; a batch straddling the boundary gets each row its expert's scale; a
rollout through the sampler then a Learner step has ratio == 1 with the two scales
different, also when the learner's rows mix experts; the key is refused, named, elsewhere.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.learner import Learner, LearnerConfig  # noqa: E402
from digenrl.math import sde_step, sigma_schedule  # noqa: E402
from digenrl.models.lora import trainable_state_dict  # noqa: E402
from digenrl.models.protocol import cond_repeat, guided_velocity  # noqa: E402
from digenrl.rollout import SampleSpec, generate  # noqa: E402
from tests.models.adapter_checks import PROMPTS, load_tiny, tiny_folder  # noqa: E402
from tests.models.tiny_diffusers_new import NEW_SETUPS, WAN22_BOUNDARY  # noqa: E402

HIGH, LOW = 4.0, 3.0  # the Wan team's T2V-A14B scales (wan/configs/wan_t2v_A14B.py): 4 high, 3 low
NEGATIVE = "blurry"


def folder(folders, tmp_path_factory, family):
    return tiny_folder(NEW_SETUPS, folders, tmp_path_factory, family)


def load(folders, tmp_path_factory, family, cache_dir, **extra):
    return load_tiny(NEW_SETUPS, folders, tmp_path_factory, family, cache_dir, **extra)


def _ode(policy, x0, sigmas, scale, scale_low):
    """Our guided ODE over `sigmas`, the batch's own prompts and the negative prompt."""
    cond, negative = policy.encode_prompts(PROMPTS), policy.negative_cond(len(PROMPTS))
    x = x0
    with torch.no_grad():
        for i in range(len(sigmas) - 1):
            v = guided_velocity(policy, x, sigmas[i].expand(len(PROMPTS)), cond, negative, scale, scale_low)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    return x


def test_two_scales_match_the_diffusers_pipeline(folders, tmp_path_factory, tmp_path):
    """guidance_scale 4 (high expert), guidance_scale_2 3 (low): our ODE == WanPipeline's, and a
    run guiding both experts with 4 (the low scale ignored) does not match."""
    from diffusers import WanPipeline

    policy = load(folders, tmp_path_factory, "wan2.2", tmp_path / "cache", train="frozen", negative_prompt=NEGATIVE)
    pipe = WanPipeline.from_pretrained(str(folder(folders, tmp_path_factory, "wan2.2")))
    pipe.set_progress_bar_config(disable=True)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    theirs = pipe(prompt=list(PROMPTS), negative_prompt=NEGATIVE, guidance_scale=HIGH, guidance_scale_2=LOW,
                  max_sequence_length=NEW_SETUPS["wan2.2"][1]["max_sequence_length"], latents=x0, height=16,
                  width=16, num_frames=5, num_inference_steps=2, output_type="latent", return_dict=False)[0]
    sigmas = pipe.scheduler.sigmas  # one step per expert
    assert sigmas[0] >= WAN22_BOUNDARY > sigmas[1] > 0

    ours = _ode(policy, x0, sigmas, HIGH, LOW)
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-5, atol=1e-5)  # ~1e-6 apart here
    # sampling.cfg_scale_low 0 (4 for both experts) fails the same comparison: on these tiny
    # random experts, one step of scale 4 instead of 3 moves the latents by ~1e-3
    one_scale = _ode(policy, x0, sigmas, HIGH, 0.0)
    assert not torch.allclose(one_scale, theirs.float(), rtol=1e-5, atol=1e-5)
    # cfg_scale_low equal to cfg_scale is the one-scale run, bit for bit
    assert torch.equal(_ode(policy, x0, sigmas, HIGH, HIGH), one_scale)


def test_a_batch_straddling_the_boundary_gets_each_row_its_experts_scale(folders, tmp_path_factory, tmp_path):
    policy = load(folders, tmp_path_factory, "wan2.2", tmp_path / "cache", train="frozen", negative_prompt=NEGATIVE)
    cond = cond_repeat(policy.encode_prompts(PROMPTS), 2)
    negative = policy.negative_cond(4)
    x = torch.randn(4, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.95, 0.3, 0.875, 0.1])  # high, low, high (the boundary itself), low
    assert torch.equal(policy.low_noise_rows(sigma), torch.tensor([False, True, False, True]))
    with torch.no_grad():
        v = guided_velocity(policy, x, sigma, cond, negative, HIGH, LOW)

        def alone(rows, scale):  # the rows as a batch of their own, one scale
            sub = {k: t[rows] for k, t in cond.items()}
            neg = {k: t[rows] for k, t in negative.items()}
            return guided_velocity(policy, x[rows], sigma[rows], sub, neg, scale)

        high, low = [0, 2], [1, 3]
        assert torch.equal(v[high], alone(high, HIGH))
        assert torch.equal(v[low], alone(low, LOW))
        assert not torch.allclose(v[low], alone(low, HIGH), atol=1e-3)  # the low scale acts


@pytest.mark.parametrize("draw_levels", [0, 2], ids=["one-step-per-slot", "rows-mix-experts"])
def test_rollout_and_learner_step_ratio_one_with_two_scales(draw_levels, folders, tmp_path_factory, tmp_path):
    """The sampler guides with each step's expert scale and the learner recomputes the same
    velocity: logp == logp_old exactly. Grid 1, 2/3, 1/3, 0: step 0 is the high expert's,
    steps 1 and 2 the low one's; both SDE steps train. draw_levels=2: each row draws its own
    step per slot, so a learner batch mixes the experts' rows (split per row)."""
    policy = load(folders, tmp_path_factory, "wan2.2", tmp_path / "cache", train="lora", lora_rank=4,
                  negative_prompt=NEGATIVE)
    prompts = [p for p in PROMPTS for _ in range(2)]
    coords = [(0, g, s) for g in range(len(PROMPTS)) for s in range(2)]
    spec = SampleSpec(sigmas=sigma_schedule(3, shift=1.0), sde_steps=(0, 1), noise_level=0.7, cfg_scale=HIGH,
                      cfg_scale_low=LOW, seed=5, draw_levels=draw_levels)
    assert spec.sigmas[0] >= WAN22_BOUNDARY > spec.sigmas[1]
    traj = generate(policy, prompts, coords, spec, step=0, version=0)
    assert torch.isfinite(traj.log_probs[:, :2]).all()
    traj.rewards = torch.arange(4.0)
    traj.advantages = torch.tensor([-1.0, 1.0, -0.5, 0.5])

    learner = Learner(policy, LearnerConfig(lr=1e-2, clip_range=1e-4))
    mixed = False
    with torch.no_grad():
        for slot in (0, 1):
            steps, recorded = Learner._recorded_log_probs(traj, slot, spec, slice(None))
            mixed |= len(set((spec.sigmas[steps] >= WAN22_BOUNDARY).tolist())) == 2
            assert torch.equal(learner.score(traj, slot, spec).log_prob, recorded)
        # the learner ignoring the low scale would not reproduce the rollout's low-expert step
        one_scale = dataclasses.replace(spec, cfg_scale_low=0.0)
        steps, recorded = Learner._recorded_log_probs(traj, 1, spec, slice(None))
        low = spec.sigmas[steps] < WAN22_BOUNDARY
        assert low.any() and not torch.allclose(learner.score(traj, 1, one_scale).log_prob[low], recorded[low])
    assert mixed == bool(draw_levels)  # per-sample draws put both experts in one batch (seed 5)

    before = {k: v.clone() for k, v in trainable_state_dict(policy.module).items()}
    learner.accumulate(traj, [0, 1], spec, total_samples=4, total_steps=2)
    metrics = learner.optimizer_step()
    assert metrics["loss/ratio_mean"] == 1.0
    after = trainable_state_dict(policy.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_cfg_scale_low_reaches_the_step_spec_and_is_refused_elsewhere(folders, tmp_path_factory, tmp_path):
    from digenrl.config.errors import ConfigError
    from digenrl.config.sampling import SamplingConfig
    from digenrl.config.schema import load_config
    from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig, TinyDiTPolicy
    from digenrl.train.trainer import plan_step, prompt_source

    path = str(folder(folders, tmp_path_factory, "wan2.2"))
    cfg = load_config(None, ["model.name=wan2.2", f"model.path={path}", "sampling.cfg_scale=4",
                             "sampling.cfg_scale_low=3"])
    spec = plan_step(cfg, prompt_source(cfg), 0).spec
    assert (spec.cfg_scale, spec.cfg_scale_low, spec.guided) == (4.0, 3.0, True)
    # the high expert unguided, the low one guided: the negative branch is still needed
    assert SamplingConfig(cfg_scale=1.0, cfg_scale_low=3.0).guided
    assert not SamplingConfig(cfg_scale=1.0, cfg_scale_low=1.0).guided

    for name, where in (("wan", [f"model.path={path}"]), ("tiny-dit", [])):
        with pytest.raises(ConfigError, match=rf"sampling\.cfg_scale_low: {name} has one transformer"):
            load_config(None, [f"model.name={name}", *where, "sampling.cfg_scale_low=3"])
    with pytest.raises(ConfigError, match=r"sampling\.cfg_scale_low: must be >= 1.*or 0"):
        SamplingConfig(cfg_scale_low=0.5)
    # below the config: a one-transformer policy refuses a low scale rather than ignore it
    tiny = TinyDiTPolicy(TinyDiT(TinyDiTConfig(image_size=8, dim=32, depth=1, heads=2)))
    x, sigma = torch.randn(2, *tiny.latent_shape), torch.full((2,), 0.5)
    with pytest.raises(ValueError, match=r"one transformer.*sampling\.cfg_scale_low"):
        guided_velocity(tiny, x, sigma, tiny.encode_prompts(["a", "b"]), tiny.negative_cond(2), 2.0, 3.0)

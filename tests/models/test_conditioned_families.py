"""Conditioned diffusers families (FLUX.1 Kontext, Qwen-Image-Edit, Wan2.1 I2V) on tiny pipelines.

Per family, on a tiny random-weight pipeline saved with `save_pretrained` and loaded back
through `load_policy` (CPU, float32):
- ODE latents equal the diffusers pipeline's own (output_type="latent") from the same
  reference image / first frame, initial noise and sigmas. Kontext and Wan I2V run with
  classifier-free guidance, so the negative branch's conditioning (protocol.guided_velocity)
  is checked against the pipeline too; Qwen-Image-Edit's pipeline rescales guided velocities,
  so it runs unguided there and its per-row negative is checked by hand below.
- a rollout through digenrl.rollout (images given per row) and a Learner step: the
  recomputed log-prob equals the recorded one exactly (ratio == 1) and the adapters move.
- the conditioning acts: another image changes the velocity.

Qwen-Image-Edit's Qwen2.5-VL text encoder reads the image: here its (prompt, image) embeddings
come through the prompt cache (QwenImageEditPolicy.text_key); its own text path is tested in
test_qwen_image_edit_text.py.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from digenrl.learner import Learner, LearnerConfig  # noqa: E402
from digenrl.math import sde_step, sigma_schedule  # noqa: E402
from digenrl.models.diffusers_adapters import load_policy  # noqa: E402
from digenrl.models.families import FAMILIES, grid_family  # noqa: E402
from digenrl.models.diffusers_adapters.packing import pack_2x2  # noqa: E402
from digenrl.models.lora import trainable_state_dict  # noqa: E402
from digenrl.models.protocol import (  # noqa: E402
    ConditionedPolicy, conditioning_of, encode_inputs, guided_velocity,
)
from digenrl.rollout import SampleSpec, generate  # noqa: E402
from tests.models.adapter_checks import check_per_row_timesteps  # noqa: E402
from tests.models.tiny_diffusers import CONDITIONED_SETUPS, fake_text_cond, tiny_images  # noqa: E402

PROMPTS = ["make it red", "add a dog"]
GROUP = 2

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return {family: build(tmp_path_factory.mktemp(family.replace("-", "_")))
            for family, (build, _, _) in CONDITIONED_SETUPS.items()}


def load(folders, family: str, cache_dir: Path, images: torch.Tensor | None = None, **extra):
    """load_policy on the tiny folder; Qwen-Image-Edit gets fake embeddings for every
    (prompt or negative prompt, image) pair of PROMPTS x `images`."""
    _, opts, shapes = CONDITIONED_SETUPS[family]
    policy = load_policy(family, str(folders[family]), prompt_cache_dir=str(cache_dir), **{**opts, **extra})
    if shapes is not None and images is not None:
        for rgb in policy.reference_rgb(images):
            for prompt in [*PROMPTS, policy.options.negative_prompt]:
                key = policy.text_key(prompt, rgb)
                policy.cache.put(key, fake_text_cond(shapes, key))
    return policy


# ---- the diffusers pipelines' own latents ----------------------------------------------------


def _to_pil(images: torch.Tensor) -> list:
    from PIL import Image

    arrays = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(a) for a in arrays]


def _pipeline_latents(family, pipe, policy, cond, images, x0, scale, monkeypatch):
    """2 deterministic steps of the pipeline from x0 (in its own layout), the same images."""
    common = dict(height=16, width=16, num_inference_steps=2, output_type="latent", return_dict=False)
    if family == "flux-kontext":
        return pipe(image=_to_pil(images), prompt=PROMPTS, negative_prompt="blurry", true_cfg_scale=scale,
                    guidance_scale=3.5, max_sequence_length=8, latents=pack_2x2(x0), _auto_resize=False, max_area=16 * 16,
                    **common)[0]
    if family == "qwen-image-edit":
        # the pipeline sizes the reference to ~1 MP (calculate_dimensions); ours is the output size
        import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit

        monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: (16, 16, None))
        return pipe(image=_to_pil(images), prompt_embeds=cond["prompt_embeds"],
                    prompt_embeds_mask=cond["prompt_embeds_mask"], true_cfg_scale=1.0,
                    latents=pack_2x2(x0), **common)[0]
    # Wan I2V: the pipeline takes one image for the whole batch, so one call per row; text
    # embeddings are ours (WanPipeline's encoder, tested in test_diffusers_adapters.py): the I2V
    # pipeline's own prompt cleaning needs ftfy, which it imports only if installed
    negative = policy.negative_cond(1)["prompt_embeds"]
    return torch.cat([
        pipe(image=_to_pil(images[i : i + 1])[0], prompt_embeds=cond["prompt_embeds"][i : i + 1],
             negative_prompt_embeds=negative, guidance_scale=scale, num_frames=5, latents=x0[i : i + 1],
             **common)[0]
        for i in range(len(PROMPTS))
    ])


@pytest.mark.parametrize("family", list(CONDITIONED_SETUPS))
def test_ode_sampling_matches_diffusers_pipeline(family, folders, tmp_path, monkeypatch):
    """Reference / first-frame encoding, token or channel concatenation, RoPE ids and the
    negative branch's conditioning agree with the pipeline's own loop."""
    import diffusers

    images = tiny_images(len(PROMPTS), seed=1)
    negative_prompt = "blurry" if family == "flux-kontext" else ""
    policy = load(folders, family, tmp_path / "cache", images, train="frozen", negative_prompt=negative_prompt)
    assert isinstance(policy, ConditionedPolicy) and conditioning_of(policy) == FAMILIES[family].conditioning
    cond = encode_inputs(policy, PROMPTS, images)
    negative = policy.negative_cond(len(PROMPTS))
    scale = 1.0 if family == "qwen-image-edit" else 2.0

    no_text = {n: None for n in policy.text_components} if CONDITIONED_SETUPS[family][2] is not None else {}
    pipe = getattr(diffusers, policy.pipeline_class).from_pretrained(str(folders[family]), **no_text)
    pipe.set_progress_bar_config(disable=True)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape, generator=torch.Generator().manual_seed(3))
    theirs = _pipeline_latents(family, pipe, policy, cond, images, x0, scale, monkeypatch)
    sigmas = pipe.scheduler.sigmas  # what the pipeline used, ending in 0

    x = x0
    with torch.no_grad():
        for i in range(2):
            v = guided_velocity(policy, x, sigmas[i].expand(len(PROMPTS)), cond, negative, scale)
            x = sde_step(x, v, sigmas[i], sigmas[i + 1], kind="ode", noise_level=0.0).prev_sample
    packed = family != "wan-i2v"
    ours, start = (pack_2x2(x), pack_2x2(x0)) if packed else (x, x0)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.float(), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(ours, start)


@pytest.mark.parametrize("family", list(CONDITIONED_SETUPS))
def test_diffusers_grid_is_the_pipelines_own(family, folders, tmp_path, monkeypatch):
    """sampling.sigmas=diffusers on a conditioned family is the grid its own pipeline sets, with
    the base family's published scheduler config in the folder (FLUX / Qwen-Image: dynamic
    shift from the sample's tokens, not the reference's; Wan: UniPC flow sigmas)."""
    import diffusers

    from digenrl.config.model import ModelConfig
    from digenrl.config.sampling import SamplingConfig
    from digenrl.models import sampling_sigmas

    root = tmp_path / family
    shutil.copytree(folders[family], root)
    published = grid_family(family).scheduler
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(published))
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "scheduler": ["diffusers", published["_class_name"]]}))
    images = tiny_images(len(PROMPTS), seed=1)
    policy = load(folders, family, tmp_path / "cache", images, train="frozen")
    cond = encode_inputs(policy, PROMPTS, images)
    no_text = {n: None for n in policy.text_components} if CONDITIONED_SETUPS[family][2] is not None else {}
    pipe = getattr(diffusers, policy.pipeline_class).from_pretrained(str(root), **no_text)
    pipe.set_progress_bar_config(disable=True)
    x0 = torch.randn(len(PROMPTS), *policy.latent_shape)
    _pipeline_latents(family, pipe, policy, cond, images, x0, 1.0, monkeypatch)  # 2 steps
    ours = sampling_sigmas(ModelConfig(name=family, path=str(root), height=16, width=16),
                           SamplingConfig(sigmas="diffusers"), 2)
    torch.testing.assert_close(ours, pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    assert not torch.allclose(ours, sigma_schedule(2, 1.0))


# ---- rollout + train step --------------------------------------------------------------------


@pytest.mark.parametrize("family", list(CONDITIONED_SETUPS))
def test_rollout_and_train_step_ratio_one(family, folders, tmp_path):
    """The conditioning entries ride in Trajectories.cond from rollout to the learner; with
    guidance on, the learner's negative branch sees them too, and logp == logp_old exactly."""
    images = tiny_images(len(PROMPTS), seed=2)
    policy = load(folders, family, tmp_path / "cache", images, train="lora", lora_rank=4)
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    rows = images.repeat_interleave(GROUP, dim=0)  # (B = 4, 3, H, W): each prompt's image
    coords = [(0, g, s) for g in range(len(PROMPTS)) for s in range(GROUP)]
    spec = SampleSpec(sigmas=sigma_schedule(3, shift=3.0), sde_steps=(0, 1), noise_level=0.7, cfg_scale=2.0, seed=5)
    traj = generate(policy, prompts, coords, spec, step=0, version=0, images=rows)
    assert {"image_latents", "first_frame_latents"} & set(traj.cond)  # the image's entries travelled
    assert torch.isfinite(traj.log_probs[:, :2]).all()
    expected = (4, 3, 16, 16) if policy.output == "image" else (4, 5, 3, 16, 16)
    assert traj.images.shape == expected

    traj.rewards = torch.arange(4.0)
    traj.advantages = torch.tensor([-1.0, 1.0, -0.5, 0.5])
    learner = Learner(policy, LearnerConfig(lr=1e-2, clip_range=1e-4))
    recorded = Learner._recorded_log_probs(traj, 1, spec, slice(None))[1]
    with torch.no_grad():
        assert torch.equal(learner.score(traj, 1, spec).log_prob, recorded)
    before = {k: v.clone() for k, v in trainable_state_dict(policy.module).items()}
    learner.accumulate(traj, [1], spec, total_samples=4, total_steps=1)
    metrics = learner.optimizer_step()
    assert metrics["loss/ratio_mean"] == 1.0
    after = trainable_state_dict(policy.module)
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("train", ["lora", "full"])
def test_packed_pass_gradient_equals_the_per_timestep_loop(train, folders, tmp_path):
    """TSP's batched replay on a diffusers family with true CFG (Qwen-Image-Edit: each row's own
    negative prompt and reference image, repeated per pair): the gradient of the unit's 4 x 2
    (sample, step) pairs in one pass, and cut across the two steps, equals the per-step loop's
    (float32, rtol 1e-4)."""
    family = "qwen-image-edit"
    images = tiny_images(len(PROMPTS), seed=2)
    policy = load(folders, family, tmp_path / "cache", images, train=train, lora_rank=4)
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    coords = [(0, g, s) for g in range(len(PROMPTS)) for s in range(GROUP)]
    spec = SampleSpec(sigmas=sigma_schedule(3, shift=3.0), sde_steps=(0, 1), noise_level=0.7, cfg_scale=2.0, seed=5)
    traj = generate(policy, prompts, coords, spec, step=0, version=0, images=images.repeat_interleave(GROUP, dim=0))
    traj.advantages = torch.tensor([-1.0, 1.0, -0.5, 0.5])
    check_per_row_timesteps(policy, traj.cond, traj.latents)
    grads = {}
    for pairs in (0, 8, 3):
        learner = Learner(policy, LearnerConfig(grad_sum="float32", pairs_per_pass=pairs))
        learner.accumulate(traj, [0, 1], spec, total_samples=4, total_steps=2)
        grads[pairs] = [None if p.grad is None else p.grad.clone() for p in learner.params]
        learner.zero_grad()
    for pairs in (8, 3):
        assert any(g is not None for g in grads[0])
        for got, want in zip(grads[pairs], grads[0]):
            assert (got is None) == (want is None)
            if want is None:  # a parameter the forward does not reach (none has a gradient either way)
                continue
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * (float(want.abs().max()) + 1e-12)), pairs


# ---- the conditioning acts -------------------------------------------------------------------


@pytest.mark.parametrize("family", list(CONDITIONED_SETUPS))
def test_another_image_changes_the_velocity(family, folders, tmp_path):
    a, b = tiny_images(2, seed=3), tiny_images(2, seed=4)
    policy = load(folders, family, tmp_path / "cache", torch.cat([a, b]), train="frozen")
    cond_a, cond_b = encode_inputs(policy, PROMPTS, a), encode_inputs(policy, PROMPTS, b)
    x = torch.randn(2, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        v_a, v_b = policy.velocity(x, sigma, cond_a), policy.velocity(x, sigma, cond_b)
        # only the image's own entries swapped (the text kept): the transformer itself reads them
        image_keys = [k for k in cond_a if k in ("image_latents", "first_frame_latents", "image_embeds")]
        swapped = {**cond_a, **{k: cond_b[k] for k in image_keys}}
        v_swapped = policy.velocity(x, sigma, swapped)
    assert not torch.allclose(v_a, v_b, atol=1e-5)
    for k in image_keys:
        assert not torch.allclose(v_a, policy.velocity(x, sigma, {**cond_a, k: cond_b[k]}), atol=1e-5), k
    assert not torch.allclose(v_a, v_swapped, atol=1e-5)
    # and the same image gives the same velocity (no hidden state between calls)
    with torch.no_grad():
        assert torch.equal(policy.velocity(x, sigma, encode_inputs(policy, PROMPTS, a)), v_a)


def test_qwen_image_edit_negative_is_the_rows_own(folders, tmp_path):
    """Qwen-Image-Edit's negative prompt is encoded with each row's image: guided_velocity's
    negative branch uses the row's negative_* entries and the row's reference latents."""
    images = tiny_images(2, seed=6)
    policy = load(folders, "qwen-image-edit", tmp_path / "cache", images, train="frozen", negative_prompt="ugly")
    cond = encode_inputs(policy, PROMPTS, images)
    assert not torch.equal(cond["negative_prompt_embeds"][0], cond["negative_prompt_embeds"][1])
    x = torch.randn(2, *policy.latent_shape)
    sigma = torch.full((2,), 0.5)
    by_hand = {**cond, "prompt_embeds": cond["negative_prompt_embeds"],
               "prompt_embeds_mask": cond["negative_prompt_embeds_mask"]}
    with torch.no_grad():
        v_c, v_n = policy.velocity(x, sigma, cond), policy.velocity(x, sigma, by_hand)
        v_cfg = guided_velocity(policy, x, sigma, cond, policy.negative_cond(2), scale=4.0)
    assert not torch.allclose(v_c, v_n, atol=1e-5)
    torch.testing.assert_close(v_cfg, v_n + 4.0 * (v_c - v_n), rtol=1e-5, atol=1e-5)


# ---- refusals --------------------------------------------------------------------------------


def test_images_are_required_exactly_for_conditioned_policies(folders, tmp_path):
    from digenrl.config.model import ModelConfig
    from digenrl.models import build_policy

    kontext = load(folders, "flux-kontext", tmp_path / "c", train="frozen")
    with pytest.raises(ValueError, match="conditioned on a reference-image"):
        encode_inputs(kontext, PROMPTS)
    with pytest.raises(ValueError, match="2 prompts but 1 conditioning image"):
        encode_inputs(kontext, PROMPTS, tiny_images(1, seed=0))
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        encode_inputs(kontext, PROMPTS, torch.rand(2, 16, 16))
    tiny = build_policy(ModelConfig(name="tiny-dit"))
    with pytest.raises(ValueError, match="prompts only"):
        encode_inputs(tiny, ["a red circle"], tiny_images(1, seed=0))
    qwen = load(folders, "qwen-image-edit", tmp_path / "q", train="frozen")
    with pytest.raises(TypeError, match="encode_inputs"):
        qwen.encode_prompts(PROMPTS)
    with pytest.raises(ValueError, match="max_sequence_length must be 512"):
        load_policy("wan-i2v", str(folders["wan-i2v"]), height=16, width=16, num_frames=5, max_sequence_length=8)


def test_a_groups_repeated_rows_are_encoded_once(folders, tmp_path, monkeypatch):
    """encode_inputs encodes each distinct (prompt, image) once and repeats its entries; an
    instruction repeated with another image is another row."""
    images = tiny_images(2, seed=8)
    policy = load(folders, "flux-kontext", tmp_path / "c", train="frozen")
    encoded = []
    inner = policy.encode_inputs
    monkeypatch.setattr(policy, "encode_inputs", lambda p, im: encoded.append(list(p)) or inner(p, im))
    prompts = ["make it red", "make it red", "make it red", "add a dog"]
    rows = images[[0, 0, 1, 1]]  # rows 0-1: one input twice; row 2: the same prompt, another image
    cond = encode_inputs(policy, prompts, rows)
    assert encoded == [["make it red", "make it red", "add a dog"]]
    alone = inner(["make it red", "make it red", "add a dog"], images[[0, 1, 1]])
    for k in cond:
        assert torch.equal(cond[k], alone[k][[0, 0, 1, 2]]), k


def test_references_of_another_size_are_resized_to_the_output(folders, tmp_path):
    kontext = load(folders, "flux-kontext", tmp_path / "c", train="frozen")
    big = torch.nn.functional.interpolate(tiny_images(2, seed=7), size=(32, 24), mode="nearest")
    cond = encode_inputs(kontext, PROMPTS, big)
    assert cond["image_latents"].shape == (2, *kontext.latent_shape)

"""sampling.sigmas: the default grid is unchanged; `diffusers` is the grid each family's
diffusers pipeline sets (checked against the tiny pipelines' own scheduler.sigmas after a run,
and against closed forms for SD3.5 and FLUX.1-dev at flow_grpo's settings)."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

pytest.importorskip("diffusers")

from digenrl.config.model import ModelConfig  # noqa: E402
from digenrl.config.sampling import SamplingConfig  # noqa: E402
from digenrl.math import sigma_schedule  # noqa: E402
from digenrl.models import sampling_sigmas  # noqa: E402
from digenrl.models.families import FAMILIES  # noqa: E402
from tests.models.tiny_diffusers import FAMILY_SETUPS, fake_text_cond  # noqa: E402

for name in ("diffusers", "transformers", "digenrl"):
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()


def _shift(t: torch.Tensor, k: float) -> torch.Tensor:
    return k * t / (1 + (k - 1) * t)


def test_default_grid_is_unchanged():
    # shift(linspace(1, 0, N + 1)): at N = 4, shift 3: 3t / (1 + 2t) at t = 1, .75, .5, .25, 0
    cfg = SamplingConfig(shift=3.0)
    got = sampling_sigmas(ModelConfig(), cfg, 4)
    torch.testing.assert_close(got, torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))
    assert torch.equal(got, sigma_schedule(4, 3.0))
    assert torch.equal(sampling_sigmas(ModelConfig(), SamplingConfig(), 10), sigma_schedule(10, 1.0))


def test_sd35_ten_steps_closed_form():
    """flow_grpo passes no sigmas: set_timesteps(10) spaces the scheduler's own sigma range
    [1, sigma_min] linearly and shifts it, sigma_min = shift(1/1000); then appends 0."""
    k = 3.0
    t_min = _shift(torch.tensor(1 / 1000, dtype=torch.float64), k)  # 0.002994
    expected = torch.cat([_shift(torch.linspace(1, float(t_min), 10, dtype=torch.float64), k), torch.zeros(1)])
    got = sampling_sigmas(ModelConfig(name="sd3", path=None, height=512, width=512),
                          SamplingConfig(sigmas="diffusers"), 10)
    torch.testing.assert_close(got, expected.float(), rtol=0, atol=2e-6)
    assert got[-2].item() == pytest.approx(0.0089, abs=5e-5)  # the last noisy sigma (ours: 0.25)
    assert sigma_schedule(10, 3.0)[-2].item() == pytest.approx(0.25)


def test_flux_dynamic_shift_closed_form():
    """FLUX.1-dev at 512 px: 32 x 32 packed tokens = 1024; mu = 0.5 + (1024 - 256) * 0.65 / 3840
    = 0.63, shift exp(mu) = 1.8776 on sigmas linspace(1, 1/6, 6), then 0."""
    mu = 0.5 + (1024 - 256) * (1.15 - 0.5) / (4096 - 256)
    t = torch.linspace(1, 1 / 6, 6, dtype=torch.float64)
    expected = torch.cat([math.exp(mu) / (math.exp(mu) + (1 / t - 1)), torch.zeros(1, dtype=torch.float64)])
    got = sampling_sigmas(ModelConfig(name="flux", path=None, height=512, width=512),
                          SamplingConfig(sigmas="diffusers"), 6)
    torch.testing.assert_close(got, expected.float(), rtol=0, atol=2e-6)
    assert math.exp(mu) == pytest.approx(1.8776, abs=1e-4)
    # the shift follows the resolution: 1024 px has 4096 tokens, mu = 1.15
    big = sampling_sigmas(ModelConfig(name="flux", path=None, height=1024, width=1024),
                          SamplingConfig(sigmas="diffusers"), 6)
    assert big[1].item() == pytest.approx(math.exp(1.15) / (math.exp(1.15) + 1 / (5 / 6) - 1), abs=2e-6)


def _run_pipeline(family: str, root, steps: int):
    """Run the tiny pipeline for `steps` steps and return the sigmas its scheduler used."""
    _, opts, shapes = FAMILY_SETUPS[family]
    cls = {"flux": "FluxPipeline", "sd3": "StableDiffusion3Pipeline", "wan": "WanPipeline",
           "qwen-image": "QwenImagePipeline", "hunyuan-video": "HunyuanVideoPipeline"}[family]
    from digenrl.models.diffusers_adapters import policy_class

    no_text = {n: None for n in policy_class(family).text_components} if shapes is not None else {}
    pipe = getattr(diffusers, cls).from_pretrained(str(root), **no_text)
    pipe.set_progress_bar_config(disable=True)
    common = dict(num_inference_steps=steps, height=opts["height"], width=opts["width"], output_type="latent",
                  generator=torch.Generator().manual_seed(0))
    if family in ("flux", "sd3", "wan"):
        extra = {"num_frames": opts["num_frames"]} if family == "wan" else {}
        guidance = 3.5 if family == "flux" else 1.0
        pipe(prompt=["a cat"], max_sequence_length=8, guidance_scale=guidance, **extra, **common)
    elif family == "qwen-image":
        cond = fake_text_cond(shapes, "a cat")
        pipe(prompt_embeds=cond["prompt_embeds"], prompt_embeds_mask=cond["prompt_embeds_mask"], **common)
    else:
        cond = fake_text_cond(shapes, "a cat")
        pipe(prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled_prompt_embeds"],
             prompt_attention_mask=cond["prompt_attention_mask"], num_frames=opts["num_frames"], **common)
    return pipe.scheduler.sigmas


# the prompt-only families with a built grid; config refuses sampling.sigmas=diffusers for the
# others (tests/models/test_new_families.py::test_diffusers_sigma_grid_is_refused_where_not_built);
# conditioned families: tests/models/test_conditioned_families.py::test_diffusers_grid_is_the_pipelines_own
@pytest.mark.parametrize("family", [n for n, f in FAMILIES.items() if f.scheduler and not f.conditioning])
def test_diffusers_grid_is_the_pipelines_own(family, tmp_path):
    """The tiny pipeline, with its family's published scheduler config written into its folder
    (FLUX and Qwen-Image: dynamic shift from the resolution; Wan: UniPC flow sigmas), sets
    exactly the sigmas sampling_sigmas reads from that folder."""
    _, opts, _ = FAMILY_SETUPS[family]
    root = FAMILY_SETUPS[family][0](tmp_path / family)
    published = FAMILIES[family].scheduler
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(published))
    index = json.loads((root / "model_index.json").read_text())  # the class from_pretrained builds
    (root / "model_index.json").write_text(json.dumps({**index, "scheduler": ["diffusers", published["_class_name"]]}))
    steps = 4
    theirs = _run_pipeline(family, root, steps)
    model = ModelConfig(name=family, path=str(root), height=opts["height"], width=opts["width"])
    ours = sampling_sigmas(model, SamplingConfig(sigmas="diffusers"), steps)
    assert ours.shape == (steps + 1,) and ours[0].item() == pytest.approx(1.0, abs=1e-4) and ours[-1] == 0.0
    torch.testing.assert_close(ours, theirs.float(), rtol=0, atol=0)
    assert not torch.allclose(ours, sigma_schedule(steps, 1.0))  # a different grid from ours


def test_diffusers_grid_reads_the_folders_scheduler(tmp_path):
    """The folder's scheduler config decides (here the tiny SD3's plain shift 3 is replaced by 5)."""
    root = FAMILY_SETUPS["sd3"][0](tmp_path / "sd3")
    model = ModelConfig(name="sd3", path=str(root), height=16, width=16)
    three = sampling_sigmas(model, SamplingConfig(sigmas="diffusers"), 5)
    config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps({**config, "shift": 5.0}))
    model5 = ModelConfig(name="sd3", path=str(root), height=16, width=32)  # another key: not the cached grid
    five = sampling_sigmas(model5, SamplingConfig(sigmas="diffusers"), 5)
    t = torch.linspace(1, float(_shift(torch.tensor(1e-3, dtype=torch.float64), 5.0)), 5, dtype=torch.float64)
    torch.testing.assert_close(five[:-1], _shift(t, 5.0).float(), rtol=0, atol=2e-6)
    assert five[2] > three[2]

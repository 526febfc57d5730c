"""Qwen-Image-Edit's, Qwen-Image's and Qwen-Image 2.1's own text paths on tiny Qwen-VL text encoders.

The folders (tests/models/tiny_qwen_vl.py) carry a tiny Qwen2_5_VLForConditionalGeneration,
a Qwen2Tokenizer whose template words are single tokens (so the pipelines' drop index cuts
the system prompt exactly) and, for the edit pipeline, a Qwen2VLProcessor folder. Without
torchvision, QwenImageEditPolicy.from_pretrained builds an image-only processor
(qwen_image_edit.image_only_processor, PIL image processor); the reference is
`QwenImageEditPipeline.encode_prompt` on that same processor and encoder, called one row at a
time on the 8-bit image computed here, not by the adapter.
- our (prompt, image) embeddings and masks, positive and negative, equal encode_prompt's per
  row (rows of different token lengths; ours padded to max_sequence_length with mask 0);
- the comparison is sensitive: the adapter patched to ignore the image (a blank one instead)
  or to pair rows with the wrong image fails it; the processor refuses the template without
  an image; another image changes a prompt's embedding;
- a rollout with the text encoder loaded (no prompt cache) and a logp recompute;
- Qwen-Image (text-to-image): encode_prompts equals QwenImagePipeline.encode_prompt;
- Qwen-Image 2.1 (Qwen3-VL, its processor image-only without torchvision as the edit one):
  encode_prompts equals QwenImage21Pipeline.encode_prompt.
"""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("diffusers")

from digenrl.math import sigma_schedule  # noqa: E402
from digenrl.models.diffusers_adapters import load_policy  # noqa: E402
from digenrl.models.protocol import NEGATIVE_PREFIX, encode_inputs  # noqa: E402
from digenrl.rollout import SampleSpec, generate  # noqa: E402
from tests.models.tiny_diffusers import tiny_images  # noqa: E402
from tests.models.tiny_qwen_vl import (  # noqa: E402
    build_qwen_image21_text, build_qwen_image_edit_text, build_qwen_image_text,
)

PROMPTS = ["make it red", "add a small dog on the left of the tree"]  # different token lengths
N = 48  # max_sequence_length: rows here have up to 35 tokens after the drop index (no cut)

for name in ("diffusers", "transformers"):
    logging.getLogger(name).setLevel(logging.ERROR)
import diffusers.utils.logging  # noqa: E402

diffusers.utils.logging.disable_progress_bar()


@pytest.fixture(scope="module")
def edit_policy(tmp_path_factory):
    root = build_qwen_image_edit_text(tmp_path_factory.mktemp("qwen_image_edit_text"))
    return load_policy("qwen-image-edit", str(root), height=16, width=16, max_sequence_length=N,
                       device="cpu", dtype="float32", train="lora", lora_rank=4, negative_prompt="blurry")


def rgb8(images: torch.Tensor) -> list:
    """(B, 3, H, W) in [0, 1] on the 8-bit grid -> (H, W, 3) uint8 arrays."""
    return list((images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy())


def pipeline_rows(policy, prompts, images) -> list[torch.Tensor]:
    """QwenImageEditPipeline.encode_prompt, one (prompt, image) at a time: (L_i, D) each."""
    from PIL import Image

    rows = []
    for prompt, rgb in zip(prompts, rgb8(images)):
        with torch.no_grad():
            embeds, mask = policy.text_pipeline.encode_prompt(prompt=[prompt], image=[Image.fromarray(rgb)],
                                                              device="cpu")
        assert mask is None or bool(mask.all())  # one row: no padding
        rows.append(embeds[0])
    return rows


def assert_matches_pipeline(policy, prompts, images) -> None:
    cond = encode_inputs(policy, prompts, images)
    negative = [policy.options.negative_prompt] * len(prompts)
    for prefix, texts in (("", prompts), (NEGATIVE_PREFIX, negative)):
        embeds, mask = cond[prefix + "prompt_embeds"], cond[prefix + "prompt_embeds_mask"]
        assert embeds.shape == (len(prompts), N, 16) and mask.shape == (len(prompts), N)
        for i, ref in enumerate(pipeline_rows(policy, texts, images)):
            n = ref.shape[0]
            assert mask[i].tolist() == [1] * n + [0] * (N - n), (prefix, i)
            torch.testing.assert_close(embeds[i, :n], ref, rtol=1e-5, atol=1e-5)
            assert not embeds[i, n:].any()


def test_edit_text_matches_the_pipelines_encode_prompt(edit_policy):
    images = tiny_images(2, seed=3)
    assert_matches_pipeline(edit_policy, PROMPTS, images)
    lengths = encode_inputs(edit_policy, PROMPTS, images)["prompt_embeds_mask"].sum(1).tolist()
    assert lengths[0] != lengths[1]
    # the drop index (64) cuts the system prompt: each row starts at <|vision_start|>, then the
    # 4 image tokens of the 56x56 resize (4x4 patches, 2x2 merge)
    tok = edit_policy.text_pipeline.tokenizer
    template = edit_policy.text_pipeline.prompt_template_encode
    ids = tok(template.format(PROMPTS[0]))["input_ids"]
    assert tok.convert_ids_to_tokens(ids[64:67]) == ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def test_edit_text_comparison_fails_without_the_rows_image(edit_policy, monkeypatch):
    images = tiny_images(2, seed=4)
    encode = type(edit_policy)._encode_text_image

    def blank(self, prompts, rgb):  # the image's content ignored
        return encode(self, prompts, [a * 0 + 128 for a in rgb])

    def swapped(self, prompts, rgb):  # each prompt with the other row's image
        return encode(self, prompts, rgb[::-1])

    for broken in (blank, swapped):
        with monkeypatch.context() as m:
            m.setattr(type(edit_policy), "_encode_text_image", broken)
            with pytest.raises(AssertionError):
                assert_matches_pipeline(edit_policy, PROMPTS, images)
    # the processor itself refuses the template's image slot without an image
    with pytest.raises(ValueError, match="no images"):
        edit_policy.text_pipeline.encode_prompt(prompt=[PROMPTS[0]], image=None, device="cpu")


def test_another_image_changes_the_prompts_embedding(edit_policy):
    images = tiny_images(2, seed=5)
    cond = encode_inputs(edit_policy, [PROMPTS[0]] * 2, images)
    for prefix in ("", NEGATIVE_PREFIX):
        assert torch.equal(cond[prefix + "prompt_embeds_mask"][0], cond[prefix + "prompt_embeds_mask"][1])
        assert not torch.allclose(cond[prefix + "prompt_embeds"][0], cond[prefix + "prompt_embeds"][1], atol=1e-4)


def test_edit_rollout_with_the_real_text_path(edit_policy):
    from digenrl.learner import Learner, LearnerConfig

    images = tiny_images(2, seed=6)
    assert edit_policy.cache is None and edit_policy.text_pipeline is not None
    spec = SampleSpec(sigmas=sigma_schedule(2, shift=3.0), sde_steps=(0,), noise_level=0.7, cfg_scale=2.0, seed=1)
    traj = generate(edit_policy, PROMPTS, [(0, 0, 0), (0, 1, 0)], spec, step=0, version=0, images=images)
    assert traj.images.shape == (2, 3, 16, 16) and torch.isfinite(traj.log_probs[:, 0]).all()
    expected = encode_inputs(edit_policy, PROMPTS, images)
    torch.testing.assert_close(traj.cond["prompt_embeds"], expected["prompt_embeds"])
    with torch.no_grad():
        score = Learner(edit_policy, LearnerConfig(lr=0.0)).score(traj, 0, spec)
    torch.testing.assert_close(score.log_prob, traj.log_probs[:, 0])


def test_qwen_image_text_matches_the_pipelines_encode_prompt(tmp_path):
    root = build_qwen_image_text(tmp_path / "qwen_image_text")
    policy = load_policy("qwen-image", str(root), height=16, width=16, max_sequence_length=N,
                         device="cpu", dtype="float32", train="frozen")
    cond = policy.encode_prompts(PROMPTS)
    tok, template = policy.text_pipeline.tokenizer, policy.text_pipeline.prompt_template_encode
    ids = tok(template.format(PROMPTS[0]))["input_ids"]
    # drop index 34 cuts the system prompt: the user's text follows
    assert tok.convert_ids_to_tokens(ids[31:34]) == ["<|im_start|>", "user", "Ċ"]
    lengths = []
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            ref, mask = policy.text_pipeline.encode_prompt(prompt=[prompt], device="cpu", max_sequence_length=N)
        n = ref.shape[1]
        lengths.append(n)
        assert cond["prompt_embeds_mask"][i].tolist() == [1] * n + [0] * (N - n)
        torch.testing.assert_close(cond["prompt_embeds"][i, :n], ref[0], rtol=1e-5, atol=1e-5)
    assert lengths[0] != lengths[1]


def test_qwen_image21_text_matches_the_pipelines_encode_prompt(tmp_path):
    root = build_qwen_image21_text(tmp_path / "qwen_image21_text")
    policy = load_policy("qwen-image-2.1", str(root), height=32, width=32, max_sequence_length=N,
                         device="cpu", dtype="float32", train="frozen")
    pipe = policy.text_pipeline
    assert type(pipe.processor).__name__ == "ImageOnlyQwen3VLProcessor"
    # the system message (counted through the chat template) is exactly the template's prefix
    ids = pipe.processor.tokenizer(pipe.prompt_template_t2i.format(PROMPTS[0]))["input_ids"]
    assert pipe.processor.tokenizer.convert_ids_to_tokens(ids[pipe._drop_idx - 2: pipe._drop_idx + 2]) == [
        "<|im_end|>", "Ċ", "<|im_start|>", "user"]
    cond = policy.encode_prompts(PROMPTS)
    lengths = []
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            ref, _, _ = pipe.encode_prompt(prompt=[prompt], device="cpu")
        n = ref.shape[1]
        lengths.append(n)
        assert cond["prompt_embeds_mask"][i].tolist() == [1] * n + [0] * (N - n)
        torch.testing.assert_close(cond["prompt_embeds"][i, :n], ref[0], rtol=1e-5, atol=1e-5)
    assert lengths[0] != lengths[1]
    # its pipeline keeps every text token too: a prompt past model.max_sequence_length is refused
    policy.max_sequence_length = max(lengths) - 1
    with pytest.raises(ValueError, match=f"qwen-image-2.1: a prompt encodes to {max(lengths)} tokens"):
        policy.encode_prompts(PROMPTS)


def test_a_pair_longer_than_max_sequence_length_is_refused_not_cut(edit_policy, monkeypatch):
    """QwenImageEditPipeline.encode_prompt keeps every token of a (prompt, image) pair (its
    max_sequence_length goes unused there), and the edit template puts the image's tokens before
    the instruction: cutting at model.max_sequence_length would drop the instruction. A pair
    that does not fit is an error naming the key (Qwen-Image 2.1's text: its test above)."""
    images = tiny_images(2, seed=7, size=16)
    full = encode_inputs(edit_policy, PROMPTS[:2], images)
    longest = int(full["prompt_embeds_mask"].sum(dim=1).max())
    monkeypatch.setattr(edit_policy, "max_sequence_length", longest - 1)
    monkeypatch.setattr(edit_policy, "cache", None)
    with pytest.raises(ValueError, match=f"raise model.max_sequence_length to at least {longest}"):
        encode_inputs(edit_policy, PROMPTS[:2], images)

"""The toy world and its programmatic rewards."""

import pytest
import torch

from digenrl.rewards.toy import JpegCompressibility, JpegIncompressibility, ToyGenEval
from digenrl.toy.world import ToyPrompt, all_prompts, sample_batch, split_prompts


def test_prompt_grammar_round_trips_and_split_is_disjoint():
    for p in all_prompts():
        assert ToyPrompt.parse(p.text) == p
    train, held = split_prompts()
    assert not set(train) & set(held) and len(train) + len(held) == len(all_prompts())
    assert 0.05 < len(held) / len(all_prompts()) < 0.3


def test_drawn_images_satisfy_their_prompts():
    imgs, texts = sample_batch(64, 32, seed=0, index=3)
    s = ToyGenEval().score(imgs, texts)
    assert s["reward"].mean() > 0.9 and s["strict"].mean() > 0.85
    assert torch.equal(s["color"], torch.ones(64))


def test_wrong_prompts_and_empty_images_score_low():
    imgs, texts = sample_batch(64, 32, seed=0, index=4)
    r = ToyGenEval()
    right = r(imgs, texts).mean()
    assert r(imgs, texts[::-1]).mean() < right - 0.4
    assert r(torch.zeros_like(imgs), texts).max() < 0.3


def test_count_credit_rises_toward_the_asked_count():
    # one red square asked; images with 1, 2, 3 red squares
    p = ToyPrompt("red", "square", 1, "anywhere").text
    imgs = torch.zeros(3, 3, 32, 32)
    for i, n in enumerate((1, 2, 3)):
        for k in range(n):
            imgs[i, 0, 2 + 10 * k : 8 + 10 * k, 4:10] = 0.9
    count = ToyGenEval().score(imgs, [p] * 3)["count"]
    assert count.tolist() == pytest.approx([1.0, 0.5, 1 / 3])


def test_jpeg_rewards_order_flat_below_noisy():
    flat = torch.full((1, 3, 32, 32), 0.5)
    noisy = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    x = torch.cat([flat, noisy])
    assert JpegIncompressibility()(x, ["", ""])[1] > JpegIncompressibility()(x, ["", ""])[0]
    assert JpegCompressibility()(x, ["", ""])[0] > JpegCompressibility()(x, ["", ""])[1]

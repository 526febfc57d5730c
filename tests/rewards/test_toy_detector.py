"""The shipped toy detector (digenrl/assets/toy_detector, `python -m digenrl.rewards.toy_detector`)
drives the geneval-detector reward on freshly drawn held-out toy images."""

import numpy as np
import pytest
import torch

from digenrl.rewards.detector import GenEvalDetector
from digenrl.rewards.toy import ToyGenEval
from digenrl.rewards.toy_detector import TOY_DETECTOR, eval_set, evaluate
from digenrl.toy.world import ToyPrompt, draw_with_boxes


@pytest.fixture(scope="module")
def reward():
    return GenEvalDetector(str(TOY_DETECTOR))


def test_shipped_checkpoint_is_small():
    size = sum(f.stat().st_size for f in TOY_DETECTOR.iterdir())
    assert size < 3_000_000, f"{TOY_DETECTOR} holds {size} bytes"


def test_strict_score_agrees_with_toy_geneval(reward):
    """20 images, half drawn from their prompt and half from a one-attribute mutation of it."""
    images, asked, drawn, _ = eval_set(20, seed=11)
    truth = torch.tensor([float(a == p.text) for a, p in zip(asked, drawn)])
    by_program = ToyGenEval().score(images, asked)["strict"]
    by_detector = reward.score(images, asked)["strict"]
    assert (by_detector == by_program).float().mean() >= 0.9
    assert (by_detector == truth).float().mean() >= 0.9
    # a wrong image never gets full marks: mutated count, colour, shape or position -> 0
    assert by_detector[truth == 0].max() == 0.0


def test_the_detector_tells_circles_from_squares_where_toy_geneval_does_not(reward):
    """ToyGenEval's strict shape test is IoU >= 0.7 with the asked shape drawn in the blob's
    box; a circle and its bounding square overlap by pi / 4 = 0.785, so it passes either
    for the other. The detector's class scores separate them."""
    gen = np.random.default_rng(3)
    for drawn, asked in (("circle", "square"), ("square", "circle")):
        img, _ = draw_with_boxes(ToyPrompt("blue", drawn, 1, "left"), 32, gen)
        images, prompts = torch.from_numpy(img)[None], [f"a blue {asked} on the left"]
        assert ToyGenEval().score(images, prompts)["strict"].item() == 1.0
        assert reward.score(images, prompts)["strict"].item() == 0.0


def test_accuracy_on_fresh_held_out_images(reward):
    """The figures docs/ quote (400 images, eval seed 1) are of the same kind; this draws another 400."""
    acc = evaluate(reward, n=400, seed=2)
    assert acc["count_accuracy"] >= 0.97
    assert acc["color_accuracy"] >= 0.99
    assert acc["strict_accuracy_faithful"] >= 0.96
    assert acc["strict_accuracy_mutated"] >= 0.98
    assert acc["strict_accuracy"] >= 0.97


def test_training_is_a_function_of_its_seed():
    """Same seed, same weights (one thread); another seed, other weights."""
    from digenrl.rewards.toy_detector import train

    a = train(steps=3, batch=4, progress=False).state_dict()
    b = train(steps=3, batch=4, progress=False).state_dict()
    c = train(steps=3, batch=4, seed=1, progress=False).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)

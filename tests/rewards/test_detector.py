"""The OWLv2 backend and the geneval-detector reward on a tiny random OWLv2 saved to disk."""

import json

import numpy as np
import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.rewards import build_reward
from digenrl.rewards.detector import (
    GENEVAL_COLORS,
    ClipColor,
    GenEvalDetector,
    MeanColor,
    OwlDetector,
    box_iou,
    nms,
)
from digenrl.rewards.geneval import Detection
from digenrl.rewards.toy_detector import new_detector, save_detector
from digenrl.toy.world import COLORS, ToyPrompt, draw_with_boxes


@pytest.fixture(scope="module")
def tiny_owl(tmp_path_factory) -> str:
    """A random OWLv2 folder (weights, config, tokenizer, preprocessor_config.json): ~150 KB."""
    return save_detector(new_detector(seed=0, width=32, layers=1, text_width=16), tmp_path_factory.mktemp("owl"))


@pytest.fixture
def metadata_jsonl(tmp_path) -> str:
    rows = [
        {"tag": "counting", "include": [{"class": "circle", "count": 2}], "exclude": [{"class": "circle", "count": 3}],
         "prompt": "a photo of two circles"},
        {"tag": "position", "include": [{"class": "square", "count": 1},
                                        {"class": "circle", "count": 1, "position": ["left of", 0]}],
         "prompt": "a photo of a circle left of a square"},
    ]  # fmt: skip
    path = tmp_path / "geneval_metadata.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_box_iou_and_nms_closed_form():
    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.9], [2.0, 2.0, 3.0, 3.0], [0.5, 0.0, 1.5, 1.0]])
    iou = box_iou(boxes, boxes)
    assert iou[0, 1] == pytest.approx(0.9)  # box 1 lies inside box 0: 0.9 / 1
    assert iou[0, 3] == pytest.approx(0.5 / 1.5)  # overlap 0.5, union 1.5
    assert iou[0, 2] == 0.0
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    assert nms(boxes, scores, 0.5).tolist() == [3, 0, 2]  # 1 overlaps 0 by 0.9 > 0.5; 0 vs 3 is 0.33
    assert nms(boxes, scores, 0.3).tolist() == [3, 2]  # now 0 overlaps 3 by 0.33 > 0.3
    assert nms(boxes, scores, 1.0).tolist() == [3, 0, 1, 2]  # 1.0 keeps all, best first
    assert nms(boxes[:0], scores[:0], 0.5).tolist() == []


def test_owl_detector_returns_well_formed_detections(tiny_owl):
    det = OwlDetector(tiny_owl, threshold=0.0, max_per_query=3, batch_size=2)
    images = torch.rand(3, 3, 24, 40, generator=torch.Generator().manual_seed(0))  # non-square: padded
    queries = [["circle"], ["square", "triangle"], []]
    out = det.detect(images, queries)
    assert len(out) == 3 and out[2] == []
    for dets, qs in zip(out, queries):
        labels = [d.label for d in dets]
        assert set(labels) <= set(qs) and all(labels.count(q) <= 3 for q in qs)
        scores = [d.score for d in dets]
        assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
        for d in dets:
            x0, y0, x1, y1 = d.box
            assert 0.0 <= x0 <= x1 <= 1.0 and 0.0 <= y0 <= y1 <= 1.0
    assert len(out[1]) > 0 and {d.label for d in out[1]} == {"square", "triangle"}  # threshold 0 keeps some


def test_padded_queries_score_zero_and_leave_the_real_queries_unchanged(tiny_owl):
    det = OwlDetector(tiny_owl)
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    alone, _ = det.raw(images[:1], [["circle"]])  # (1, P, 1)
    padded, boxes = det.raw(images, [["circle"], ["square", "triangle"]])  # image 0's 2nd query is padding
    assert torch.allclose(padded[0, :, :1], alone[0], atol=1e-5)
    assert padded[0, :, 1].max() == 0.0  # masked to the dtype's min logit -> sigmoid 0
    assert boxes.shape == (2, padded.shape[1], 4)


def test_boxes_map_back_from_the_padded_square(tiny_owl):
    """A (H, W) = (16, 32) image is padded to 32 x 32: a box's y in the square doubles on the image."""
    det = OwlDetector(tiny_owl)
    wide = torch.rand(1, 3, 16, 32, generator=torch.Generator().manual_seed(2))
    square = torch.nn.functional.pad(wide, (0, 0, 0, 16))  # what preprocessing does, done by hand
    s_wide, b_wide = det.raw(wide, [["circle"]])
    s_sq, b_sq = det.raw(square, [["circle"]])
    assert torch.allclose(s_wide, s_sq, atol=1e-5)
    expected = (b_sq * torch.tensor([1.0, 2.0, 1.0, 2.0])).clamp(0, 1)
    assert torch.allclose(b_wide, expected, atol=1e-5)


def test_reward_runs_end_to_end_on_toy_and_jsonl_prompts(tiny_owl, metadata_jsonl):
    reward = GenEvalDetector(tiny_owl, metadata=metadata_jsonl, threshold=0.0, counting_threshold=0.0)
    prompts = ["two red circles on the left", "a photo of two circles", "a photo of a circle left of a square"]
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    out = reward.score(images, prompts)
    assert set(out) == {"reward", "strict", "count", "color", "position", "exclude"}
    for v in out.values():
        assert v.shape == (3,) and v.dtype == torch.float32 and ((v >= 0) & (v <= 1)).all()
    # threshold 0 keeps every patch (up to max_objects=16 after NMS), so "fewer than 3" fails
    assert out["exclude"][:2].tolist() == [0.0, 0.0] and out["strict"][:2].tolist() == [0.0, 0.0]
    assert torch.equal(reward(images, prompts), out["reward"])
    by_name = build_reward("geneval-detector", {"geneval-detector": f"path={tiny_owl}&metadata={metadata_jsonl}"})
    assert isinstance(by_name, GenEvalDetector) and by_name.threshold == 0.3 and len(by_name.metadata) == 2
    bare = build_reward("geneval-detector", {"geneval-detector": tiny_owl})  # a bare path is `path`
    assert bare.metadata == {}


def test_counting_prompts_use_the_counting_threshold(tiny_owl, metadata_jsonl):
    images = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    strict_count = GenEvalDetector(tiny_owl, metadata=metadata_jsonl, threshold=0.0, counting_threshold=1.0)
    out = strict_count.score(images, ["a photo of two circles"])  # nothing scores >= 1.0: count fails
    assert out["count"].item() == 0.0 and out["exclude"].item() == 1.0
    lenient = GenEvalDetector(tiny_owl, metadata=metadata_jsonl, threshold=1.0, counting_threshold=0.0)
    out = lenient.score(images, ["a photo of two circles"])  # every patch above 0: count holds
    assert out["count"].item() == 1.0


def test_mean_color_names_the_toy_colours():
    gen = np.random.default_rng(0)
    for color in COLORS:
        for shape in ("square", "circle", "triangle"):
            img, boxes = draw_with_boxes(ToyPrompt(color, shape, 2, "anywhere"), 32, gen)
            dets = [Detection(shape, 1.0, tuple(b)) for b in boxes.tolist()]
            assert MeanColor()(torch.from_numpy(img), dets) == [color, color]


def test_clip_color_returns_geneval_colour_names(tiny_clip_dir):
    colour = ClipColor(tiny_clip_dir)
    img = torch.rand(3, 32, 32, generator=torch.Generator().manual_seed(5))
    names = colour(img, [Detection("cup", 0.9, (0.1, 0.1, 0.5, 0.5)), Detection("cup", 0.8, (0.5, 0.5, 0.52, 0.52))])
    assert len(names) == 2 and all(n in GENEVAL_COLORS for n in names)
    assert colour(img, []) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 1.5}, "threshold must be a number in \\[0, 1\\]"),
        ({"counting_threshold": -0.1}, "counting_threshold must be a number in \\[0, 1\\]"),
        ({"nms_iou": 2}, "nms_iou must be a number in \\[0, 1\\]"),
        ({"max_objects": 0}, "max_objects must be an integer >= 1"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"metadata": "/no/such/geneval.jsonl"}, "metadata='/no/such/geneval.jsonl' does not exist"),
        ({"clip_path": "/no/such/clip"}, "clip_path='/no/such/clip' does not exist"),
    ],
)
def test_bad_arguments_are_refused_naming_the_key(tiny_owl, kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenEvalDetector(tiny_owl, **kwargs)


def test_refusals_by_name_and_for_unknown_prompts(tiny_owl, tmp_path):
    with pytest.raises(ValueError, match="path='/no/such/owl' does not exist"):
        GenEvalDetector("/no/such/owl")
    with pytest.raises(TypeError, match="threshhold"):  # a misspelt key in reward.paths is named
        build_reward("geneval-detector", {"geneval-detector": f"path={tiny_owl}&threshhold=0.5"})
    with pytest.raises(ConfigError, match="reward.paths.geneval-detector"):
        load_config(None, ["reward.weights={geneval-detector: 1.0}"])
    cfg = load_config(None, ["reward.weights={geneval-detector: 1.0}", f"reward.paths.geneval-detector={tiny_owl}"])
    assert cfg.reward.paths["geneval-detector"] == tiny_owl
    reward = GenEvalDetector(tiny_owl)
    with pytest.raises(ValueError, match="no metadata for prompt 'a photo of a cat'"):
        reward.score(torch.rand(1, 3, 32, 32), ["a photo of a cat"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "include": [{"class": "a", "count": 1, "position": ["left of", 3]}]}))
    with pytest.raises(ValueError, match="bad.jsonl:1: include\\[0\\].position"):
        GenEvalDetector(tiny_owl, metadata=str(bad))
    twice = tmp_path / "twice.jsonl"
    rows = [{"prompt": "p", "include": [{"class": "a", "count": n}]} for n in (1, 2)]
    twice.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match="twice.jsonl:2: prompt 'p' appears twice"):
        GenEvalDetector(tiny_owl, metadata=str(twice))
    with pytest.raises(ValueError, match="scores images \\(B, 3, H, W\\)"):
        reward.score(torch.rand(1, 2, 3, 32, 32), ["a red circle"])


def test_metadata_from_a_named_prompt_set(tiny_owl, metadata_jsonl, monkeypatch):
    # metadata=geneval reads the set's train and test metadata (digenrl.prompt_sets, fetched and
    # checked there: tests/test_prompt_sets.py); geneval:test one split
    import digenrl.prompt_sets as sets

    rows = {json.loads(line)["prompt"]: json.loads(line) for line in open(metadata_jsonl)}
    first, second = list(rows)
    asked = []

    def fake(name, split):
        asked.append((name, split))
        return {first: rows[first]} if split == "train" else {second: rows[second]}

    monkeypatch.setattr(sets, "prompt_metadata", fake)
    assert GenEvalDetector(tiny_owl, metadata="geneval").metadata == rows
    assert GenEvalDetector(tiny_owl, metadata="geneval:test").metadata == {second: rows[second]}
    assert asked == [("geneval", "train"), ("geneval", "test"), ("geneval", "test")]
    with pytest.raises(ValueError, match="does not exist"):
        GenEvalDetector(tiny_owl, metadata="genevals")  # not a set: a path, and none there

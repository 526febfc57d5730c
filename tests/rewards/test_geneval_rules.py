"""GenEval's rules on hand-made detections, with expected numbers worked out in comments."""

import pytest

from digenrl.rewards.geneval import (
    Detection,
    check_metadata,
    in_half,
    relative_position,
    score_detections,
    summarize,
    toy_metadata,
)
from digenrl.toy.world import ToyPrompt

SIZE = (100, 100)  # (H, W): normalised boxes x 100 = pixels


def det(label, score, box):
    return Detection(label, score, tuple(box))


def run(meta, objects, colors=None):
    """summary dict; colours by detection (default "red"), recording which detections were asked."""
    asked = []

    def color_of(d):
        asked.append(d)
        return (colors or {}).get(d, "red")

    return summarize(score_detections(meta, objects, color_of, SIZE)), asked


def test_relative_position_closed_forms():
    # A left of B: offset (-20, 0), summed widths 20 -> shrunk by 2 to (-18, 0); -18 / 20 = -0.9 < -0.5
    assert relative_position((0, 0, 10, 10), (20, 0, 30, 10)) == {"left of"}
    assert relative_position((20, 0, 30, 10), (0, 0, 10, 10)) == {"right of"}
    # diagonal: (-20, -20) shrinks to (-18, -18); / 28.28 = -0.64 on both axes -> two relations
    assert relative_position((0, 0, 10, 10), (20, 20, 30, 30)) == {"left of", "above"}
    assert relative_position((0, 20, 10, 30), (0, 0, 10, 10)) == {"below"}
    # offset 1 px, within 10% of the summed widths (2 px): no relation
    assert relative_position((0, 0, 10, 10), (1, 0, 11, 10)) == set()
    # mostly vertical: (-4, -20) -> (-2, -18) / 20.4 = (-0.10, -0.88): above only
    assert relative_position((0, 0, 10, 10), (4, 20, 14, 30)) == {"above"}


def test_in_half():
    assert in_half((0.1, 0.1, 0.4, 0.3), "left") and in_half((0.1, 0.1, 0.4, 0.3), "top")
    assert not in_half((0.1, 0.1, 0.4, 0.3), "right") and not in_half((0.1, 0.1, 0.4, 0.3), "bottom")
    assert not in_half((0.4, 0.4, 0.6, 0.6), "left")  # centre exactly on the midline: in neither half


def test_counting_with_exclude():
    meta = {"tag": "counting", "include": [{"class": "cup", "count": 2}], "exclude": [{"class": "cup", "count": 3}]}
    cups = [det("cup", 0.9, (0.1 * i, 0, 0.1 * i + 0.05, 0.1)) for i in range(4)]
    two, _ = run(meta, {"cup": cups[:2]})
    assert two["strict"] == 1.0 and two["reward"] == 1.0
    one, _ = run(meta, {"cup": cups[:1]})  # include fails, exclude (1 < 3) holds: 1 of 2 clauses
    assert one["strict"] == 0.0 and one["reward"] == 0.5 and one["count"] == 0.0 and one["exclude"] == 1.0
    three, _ = run(meta, {"cup": cups[:3]})  # include holds (>= 2), exclude fails (3 >= 3)
    assert three["strict"] == 0.0 and three["reward"] == 0.5 and three["exclude"] == 0.0
    none, _ = run(meta, {})
    assert none["reward"] == 0.5 and none["strict"] == 0.0
    other_class, _ = run(meta, {"dog": cups[:2]})  # detections of another class count for nothing
    assert other_class["count"] == 0.0


def test_colour_is_checked_on_the_top_count_detections_only():
    meta = {"include": [{"class": "bag", "count": 1, "color": "pink"}]}
    best, second = det("bag", 0.9, (0, 0, 0.2, 0.2)), det("bag", 0.5, (0.5, 0.5, 0.7, 0.7))
    out, asked = run(meta, {"bag": [best, second]}, colors={best: "black", second: "pink"})
    assert asked == [best]  # GenEval takes objects[class][:count]
    assert out["color"] == 0.0 and out["count"] == 1.0 and out["reward"] == 0.5 and out["strict"] == 0.0
    out, _ = run(meta, {"bag": [best]}, colors={best: "pink"})
    assert out["strict"] == 1.0
    # count fails: the colour clause fails without asking the classifier (count 0/1, colour 0/1)
    out, asked = run(meta, {})
    assert asked == [] and out["reward"] == 0.0


def test_relative_position_against_an_earlier_entry():
    meta = {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}]}
    dog = det("dog", 0.9, (0.6, 0.4, 0.8, 0.6))
    cat_left, cat_right = det("cat", 0.9, (0.1, 0.4, 0.3, 0.6)), det("cat", 0.9, (0.85, 0.4, 0.95, 0.6))
    ok, _ = run(meta, {"dog": [dog], "cat": [cat_left]})
    assert ok["strict"] == 1.0 and ok["position"] == 1.0
    bad, _ = run(meta, {"dog": [dog], "cat": [cat_right]})  # 2 counts met, position not: 2 of 3
    assert bad["strict"] == 0.0 and bad["reward"] == pytest.approx(2 / 3)
    no_dog, _ = run(meta, {"cat": [cat_left]})  # nothing to be left of: count(dog) and position fail
    assert no_dog["reward"] == pytest.approx(1 / 3) and no_dog["position"] == 0.0


def test_image_half_position_toy_extension():
    meta = toy_metadata(ToyPrompt("red", "circle", 2, "left"))
    assert meta["include"] == [{"class": "circle", "count": 2, "color": "red", "position": ["left", "image-half"]}]
    assert meta["exclude"] == [{"class": "circle", "count": 3}]
    left = [det("circle", 0.9, (0.05, 0.1 + 0.4 * i, 0.3, 0.35 + 0.4 * i)) for i in range(2)]
    out, _ = run(meta, {"circle": left})
    assert out["strict"] == 1.0 and out["reward"] == 1.0
    moved = [left[0], det("circle", 0.8, (0.6, 0.1, 0.85, 0.35))]  # one on the right: position 0 of 1
    out, _ = run(meta, {"circle": moved})
    assert out["position"] == 0.0 and out["reward"] == 0.75 and out["strict"] == 0.0  # 3 of 4 clauses
    out, _ = run(meta, {"circle": left}, colors={left[1]: "blue"})  # colour fails, position then unchecked
    assert out["color"] == 0.0 and out["position"] == 0.0 and out["reward"] == 0.5


def test_anywhere_toy_prompts_have_no_position_clause():
    meta = toy_metadata(ToyPrompt("blue", "square", 1, "anywhere"))
    assert "position" not in meta["include"][0]
    out, _ = run(meta, {"square": [det("square", 0.9, (0.6, 0.6, 0.9, 0.9))]}, colors={})
    assert out["color"] == 0.0 and out["position"] == 1.0  # "red" by default: 2 of 3 clauses
    assert out["reward"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "meta, field",
    [
        ({}, "'include'"),
        ({"include": [{"count": 1}]}, "include\\[0\\] needs a non-empty string 'class'"),
        ({"include": [{"class": "a", "count": 0}]}, "include\\[0\\].count"),
        ({"include": [{"class": "a", "count": 1, "size": 3}]}, "unknown keys \\['size'\\]"),
        ({"include": [{"class": "a", "count": 1, "position": ["left of", 0]}]}, "include\\[0\\].position"),
        ({"include": [{"class": "a", "count": 1}, {"class": "b", "count": 1, "position": ["beside", 0]}]},
         "include\\[1\\].position"),
        ({"include": [{"class": "a", "count": 1, "position": ["left of", "image-half"]}]}, "include\\[0\\].position"),
        ({"include": [{"class": "a", "count": 1}], "exclude": [{"class": "a", "count": 1, "color": "red"}]},
         "exclude\\[0\\]: unknown keys"),
    ],
)  # fmt: skip
def test_malformed_metadata_is_refused_naming_the_field(meta, field):
    with pytest.raises(ValueError, match=field):
        check_metadata(meta)

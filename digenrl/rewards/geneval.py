"""GenEval's rules on detections (Ghosh et al. 2023), with partial credit for RL.

GenEval judges an image against per-prompt metadata, one JSON object per prompt:

    {"tag": "counting", "prompt": "a photo of two wine glasses",
     "include": [{"class": "wine glass", "count": 2}],      at least 2 detected
     "exclude": [{"class": "wine glass", "count": 3}]}      fewer than 3 detected
    include entries may add "color": "pink" (the top-`count` detections, by score, must
    include `count` of that colour) and "position": ["left of", 0] (each of them must
    stand in that relation to every object matched by include[0]).

An include entry is checked in GenEval's order: count, then colour on the top-`count`
detections, then position, only if the entry's earlier clauses held; an entry that fails
leaves nothing for later entries to be positioned against. An image is correct (strict
1) when every clause holds. For RL the reward is the fraction of clauses that hold
(each include entry gives 1-3 clauses, each exclude entry one), so it equals 1 exactly
when strict does. A clause that could not be checked (the count failed) counts as failed.

Toy extension: the toy world's positions are halves of the image, not relations between
objects, so a position may also read ["left", "image-half"] (or right/top/bottom): each
of the entry's top-`count` boxes must have its centre in that half.
"""

from __future__ import annotations

import json
from typing import Callable, Mapping, NamedTuple

import numpy as np

from digenrl.toy.world import ToyPrompt

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")
HALVES = ("left", "right", "top", "bottom")
IMAGE_HALF = "image-half"  # toy extension: position target that is the image, not an include entry
POSITION_THRESHOLD = 0.1  # GenEval: offsets within 10% of the two boxes' summed size do not count
CLAUSES = ("count", "color", "position", "exclude")


class Detection(NamedTuple):
    """One detected object: its query label, score in [0, 1], box (x0, y0, x1, y1) normalised to [0, 1]."""

    label: str
    score: float
    box: tuple[float, float, float, float]


def relative_position(box_a, box_b) -> set[str]:
    """GenEval's relations of box A to box B (pixel xyxy): a subset of RELATIONS.

    The centre offset is shrunk by POSITION_THRESHOLD x (summed box sizes) per axis; a
    relation holds when the shrunk offset's component along it exceeds half the length
    of the unshrunk offset (so mostly-diagonal offsets give two relations, none if tiny).
    """
    a, b = np.asarray(box_a, dtype=np.float64), np.asarray(box_b, dtype=np.float64)
    offset = (a[:2] + a[2:]) / 2 - (b[:2] + b[2:]) / 2  # (dx, dy), y grows downward
    dims = (a[2:] - a[:2]) + (b[2:] - b[:2])
    revised = np.maximum(np.abs(offset) - POSITION_THRESHOLD * dims, 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    rel = set()
    if dx < -0.5:
        rel.add("left of")
    if dx > 0.5:
        rel.add("right of")
    if dy < -0.5:
        rel.add("above")
    if dy > 0.5:
        rel.add("below")
    return rel


def in_half(box, half: str) -> bool:
    """Toy extension: is the centre of a normalised xyxy box strictly inside `half` of the image?"""
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return {"left": cx < 0.5, "right": cx > 0.5, "top": cy < 0.5, "bottom": cy > 0.5}[half]


def check_metadata(meta: Mapping, where: str = "metadata") -> None:
    """Raise a ValueError naming the field when `meta` is not GenEval-shaped."""
    include = meta.get("include")
    if not isinstance(include, list) or not include:
        raise ValueError(f"{where}: 'include' must be a non-empty list of {{class, count, ...}} entries")
    for kind in ("include", "exclude"):
        for i, req in enumerate(meta.get(kind, [])):
            field = f"{where}: {kind}[{i}]"
            if not isinstance(req, Mapping) or not isinstance(req.get("class"), str) or not req["class"]:
                raise ValueError(f"{field} needs a non-empty string 'class'")
            if not isinstance(req.get("count"), int) or req["count"] < 1:
                raise ValueError(f"{field}.count must be an integer >= 1, got {req.get('count')!r}")
            extra = set(req) - ({"class", "count", "color", "position"} if kind == "include" else {"class", "count"})
            if extra:
                raise ValueError(f"{field}: unknown keys {sorted(extra)}")
            if "color" in req and not isinstance(req["color"], str):
                raise ValueError(f"{field}.color must be a colour name, got {req['color']!r}")
            if "position" in req:
                pos = req["position"]
                ok = isinstance(pos, (list, tuple)) and len(pos) == 2 and (
                    (pos[1] == IMAGE_HALF and pos[0] in HALVES)
                    or (isinstance(pos[1], int) and 0 <= pos[1] < i and pos[0] in RELATIONS)
                )
                if not ok:
                    raise ValueError(
                        f"{field}.position must be [<{'|'.join(RELATIONS)}>, <index of an earlier include entry>] "
                        f"or [<{'|'.join(HALVES)}>, {IMAGE_HALF!r}], got {pos!r}"
                    )


def load_metadata(path: str) -> dict[str, dict]:
    """prompt -> metadata from a GenEval metadata jsonl (one JSON object with a 'prompt' per line)."""
    table: dict[str, dict] = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            meta = json.loads(line)
            where = f"{path}:{n}"
            if not isinstance(meta.get("prompt"), str):
                raise ValueError(f"{where}: needs a string 'prompt'")
            check_metadata(meta, where)
            if table.get(meta["prompt"], meta) != meta:
                raise ValueError(f"{where}: prompt {meta['prompt']!r} appears twice with different metadata")
            table[meta["prompt"]] = meta
    return table


def toy_metadata(prompt: ToyPrompt) -> dict:
    """A toy-world prompt as GenEval metadata: the shape is the class, exactly `count` of it."""
    req: dict = {"class": prompt.shape, "count": prompt.count, "color": prompt.color}
    if prompt.position != "anywhere":
        req["position"] = [prompt.position, IMAGE_HALF]
    return {
        "tag": "toy",
        "prompt": prompt.text,
        "include": [req],
        "exclude": [{"class": prompt.shape, "count": prompt.count + 1}],
    }


def query_classes(meta: Mapping) -> list[str]:
    """The distinct classes a detector must be asked for, in first-mention order."""
    return list(dict.fromkeys(r["class"] for r in [*meta["include"], *meta.get("exclude", [])]))


def score_detections(
    meta: Mapping,
    objects: Mapping[str, list[Detection]],
    color_of: Callable[[Detection], str],
    size_hw: tuple[int, int],
) -> dict[str, tuple[int, int]]:
    """(met, total) clauses per kind in CLAUSES for one image.

    objects: class -> its detections above the score threshold, highest score first.
    color_of: a detection's colour name (called only where GenEval would classify one).
    size_hw: the image's (H, W), so relative positions are judged in pixels as GenEval does.
    """
    tally = {k: [0, 0] for k in CLAUSES}

    def clause(kind: str, ok: bool) -> bool:
        tally[kind][0] += int(ok)
        tally[kind][1] += 1
        return ok

    h, w = size_hw
    to_pixels = np.array([w, h, w, h], dtype=np.float64)
    matched_groups: list[list[Detection] | None] = []
    for req in meta["include"]:
        found = list(objects.get(req["class"], []))[: req["count"]]
        matched = clause("count", len(found) >= req["count"])
        if "color" in req:
            colors = [color_of(d) for d in found] if matched else []
            matched = clause("color", matched and colors.count(req["color"]) >= req["count"]) and matched
        if "position" in req:
            rel, target = req["position"]
            if not matched:
                ok = False
            elif target == IMAGE_HALF:
                ok = all(in_half(d.box, rel) for d in found)
            else:
                group = matched_groups[target]
                ok = group is not None and all(
                    rel in relative_position(np.asarray(d.box) * to_pixels, np.asarray(t.box) * to_pixels)
                    for d in found
                    for t in group
                )
            matched = clause("position", ok) and matched
        matched_groups.append(found if matched else None)
    for req in meta.get("exclude", []):
        clause("exclude", len(objects.get(req["class"], [])) < req["count"])
    return {k: (met, total) for k, (met, total) in tally.items()}


def summarize(tally: Mapping[str, tuple[int, int]]) -> dict[str, float]:
    """reward (fraction of all clauses met), strict (all met), and each kind's fraction (1.0 if none)."""
    met, total = sum(m for m, _ in tally.values()), sum(t for _, t in tally.values())
    out = {"reward": met / total, "strict": float(met == total)}
    out.update({k: (m / t if t else 1.0) for k, (m, t) in tally.items()})
    return out

"""Named prompt sets: flow_grpo's pickscore, ocr, geneval and drawbench, by name.

    data.prompts=pickscore          trains on pickscore's train split
    data.prompts=pickscore:test     names the split
    data.eval_prompts=auto          (default) pairs with data.prompts: a set's test split

A bare NAME means the train split where it is the training prompts and the test split
where it is the held-out prompts. drawbench has a test split only: training on it must
be asked for (drawbench:test). Files are fetched once into a local cache and checked
against the registry's digests on every load (cache.py); `digenrl prompts fetch NAME`
fills the cache ahead of time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from digenrl.prompt_sets.cache import PromptSetError, cache_path, ensure
from digenrl.prompt_sets.registry import PROMPT_SETS, SPLITS, PromptSet

__all__ = ["PROMPT_SETS", "PromptSetError", "parse_spec", "check_spec", "load_set", "prompt_metadata", "fetch",
           "cache_path"]


def _names() -> str:
    return ", ".join(PROMPT_SETS)


def parse_spec(spec: str) -> Optional[tuple[str, Optional[str]]]:
    """'pickscore' -> ('pickscore', None); 'pickscore:test' -> ('pickscore', 'test'); None
    when `spec` does not name a registered set (then it is a file, or 'toy')."""
    name, sep, split = spec.partition(":")
    if name not in PROMPT_SETS:
        return None
    return name, (split if sep else None)


def resolve(spec: str, *, held_out: bool) -> tuple[PromptSet, str]:
    """The set and split `spec` reads; raises PromptSetError saying what is allowed."""
    parsed = parse_spec(spec)
    if parsed is None:
        raise PromptSetError(f"{spec!r} is not a named prompt set; named sets: {_names()}")
    name, split = parsed
    s = PROMPT_SETS[name]
    if split is None:
        split = "test" if held_out else "train"
        if split not in s.splits:
            raise PromptSetError(f"{name} has no {split} split" + (f" ({s.note})" if s.note else "")
                                 + f"; to use its {'/'.join(s.splits)} split say {name}:{next(iter(s.splits))}")
    elif split not in s.splits:
        raise PromptSetError(f"{spec!r}: {name} has no split {split!r}; splits: {', '.join(s.splits)}"
                             + ("" if split in SPLITS else f" (the form is NAME:SPLIT, SPLIT one of {', '.join(SPLITS)})"))
    return s, split


def check_spec(spec: str, *, held_out: bool) -> None:
    """Refuse, without reading any file, a spec that names a set wrongly: an unknown split, a
    set without the split a bare name means, or 'word:split' whose word is no set's name.
    Specs that are neither (toy, file paths) pass: the files are checked before the run."""
    if parse_spec(spec) is not None:
        resolve(spec, held_out=held_out)
        return
    word, sep, split = spec.partition(":")
    if sep and split in SPLITS and "/" not in word and "." not in word:
        raise PromptSetError(f"{word!r} is not a named prompt set; named sets: {_names()}")


def load_set(spec: str, *, held_out: bool, progress: bool = False) -> list[str]:
    """The prompts of a named set's split, in file order (fetched into the cache if needed)."""
    s, split = resolve(spec, held_out=held_out)
    if s.format == "geneval-jsonl":
        return [row["prompt"] for row in _rows(s, split, progress)]
    path = ensure(s, split, progress=progress)
    # flow_grpo's TextPromptDataset: each line stripped; blank lines dropped here (none in the pinned files)
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prompt_metadata(name: str, split: str) -> dict[str, dict]:
    """prompt -> its metadata row, for sets that carry metadata (geneval: {"tag", "include",
    "exclude", "prompt"}, what a detector reward checks). A prompt listed twice must carry the
    same row both times (geneval's test file lists each of 553 prompts 4 times)."""
    s, split = resolve(f"{name}:{split}", held_out=True)
    if s.format != "geneval-jsonl":
        raise PromptSetError(f"{name} has no prompt metadata (one prompt per line); sets with metadata: "
                             + ", ".join(n for n, p in PROMPT_SETS.items() if p.format == "geneval-jsonl"))
    out: dict[str, dict] = {}
    for row in _rows(s, split, False):
        if out.setdefault(row["prompt"], row) != row:
            raise PromptSetError(f"{name}:{split}: prompt {row['prompt']!r} appears with two different metadata rows")
    return out


def _rows(s: PromptSet, split: str, progress: bool) -> list[dict]:
    path = ensure(s, split, progress=progress)
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptSetError(f"{path}:{i}: not a JSON object ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise PromptSetError(f"{path}:{i}: a metadata row needs a string 'prompt'")
        rows.append(row)
    return rows


def fetch(name: str, split: Optional[str] = None, *, progress: bool = True) -> list[Path]:
    """Download (if not cached) and verify `name`'s files: one split, or all of them."""
    if name not in PROMPT_SETS:
        raise PromptSetError(f"{name!r} is not a named prompt set; named sets: {_names()}")
    s = PROMPT_SETS[name]
    if split is not None and split not in s.splits:
        raise PromptSetError(f"{name} has no split {split!r}; splits: {', '.join(s.splits)}")
    return [ensure(s, sp, progress=progress) for sp in ([split] if split else s.splits)]

"""Calibration JSONL files: read, merge a profile run into one, complete one from the H200 file."""

from __future__ import annotations

import json
import os
from pathlib import Path


def record_key(r: dict) -> tuple[str, str]:
    """Lines that one profile run replaces as a set: same model (or none) and same measurement."""
    return (r.get("model", ""), r["what"])


def merge_records(base: list[dict], new: list[dict]) -> list[dict]:
    """base with every (model, what) that `new` measured replaced by new's lines."""
    replaced = {record_key(r) for r in new}
    return [r for r in base if record_key(r) not in replaced] + list(new)


def load_calibration_file(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Write atomically (a temporary file renamed over `path`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def merge_into_file(path: Path, new: list[dict], *, fill_from_h200: bool = False) -> list[dict]:
    """Write `new` into `path`, merged over what the file already holds (and, with
    fill_from_h200, over the packaged H200 calibration); returns every line written."""
    base: list[dict] = []
    if fill_from_h200:
        from digenrl.sim.calibration import load_calibration

        base = load_calibration()
    if path.exists():
        base = merge_records(base, load_calibration_file(path))
    records = merge_records(base, new)
    write_jsonl(path, records)
    return records


def check_loadable(path: Path, names: set[str]) -> tuple[bool, str]:
    """Does CostModel load the file, and which profiled models does it fit from it?"""
    from digenrl.sim.costs import CostModel

    try:
        cm = CostModel(calibration=path)
    except Exception as e:  # noqa: BLE001 - report whatever the cost model rejects
        return False, f"CostModel({str(path)!r}) fails: {type(e).__name__}: {e} (try --fill-from-h200)"
    used = sorted({m for m, _ in cm.table if m in names})
    unused = sorted(names - set(used))
    msg = f"CostModel({str(path)!r}) loads; fitted from your measurements: {used or 'none'}"
    if unused:
        msg += f"; not read by the cost model (not one of its models at its calibration shape): {unused}"
    return True, msg

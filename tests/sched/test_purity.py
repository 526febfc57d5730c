"""sched is pure Python: no Ray, no torch, no clock (the repo check greps the same)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2] / "digenrl"
BANNED = re.compile(r"^\s*(import|from)\s+(ray|torch|time|datetime)\b", re.M)


def test_sched_and_sim_engine_import_no_ray_torch_or_clock():
    files = list((ROOT / "sched").glob("*.py")) + [ROOT / "sim" / "engine.py", ROOT / "trace.py"]
    for f in files:
        assert not BANNED.search(f.read_text()), f

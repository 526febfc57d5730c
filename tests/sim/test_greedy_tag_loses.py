"""The preset where greedy TAG loses throughput against TAG off and BTS does not (issue 38),
benchmarks/testbeds/greedy-tag-loses.yaml at benchmarks/greedy_tag_loses.py's knobs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "greedy_tag_loses.py"


@pytest.mark.slow
def test_greedy_tag_loses_and_bts_does_not_on_the_preset():
    spec = importlib.util.spec_from_file_location("greedy_tag_loses", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = bench.three(steps=6)
    off, greedy, bts = (runs[k].throughput for k in ("TAG off", "greedy TAG", "BTS"))
    assert greedy < 0.9 * off  # greedy TAG costs throughput in the steady state (0.83x on 2026-12-03)
    assert bts >= off * (1 - 1e-9)  # BTS does not
    assert runs["greedy TAG"].fn.tag_switches > 0  # greedy's trainers did generate

"""The paper's testbeds (issue 38 item 4): the data-sheet devices, the presets in
benchmarks/testbeds/paper-*.yaml, and the row table of benchmarks/paper_ablation.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

from digenrl.sim.costs import default_cost_model
from digenrl.sim.devices import get_device, scale_seconds
from digenrl.sim.testbed import load_testbed
from digenrl.sim.workload import RunSpec, refusal

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_ablation.py"
_spec = importlib.util.spec_from_file_location("paper_ablation", SCRIPT)
ablation = sys.modules["paper_ablation"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(ablation)

PRESETS = [(c, w) for c in ablation.CLUSTERS for w in ablation.WORKLOADS]
# cluster -> {device: (count, role)}, the paper's testbeds as the issue states them
CLUSTER = {"a": {"RTX-A6000": (32, "any")}, "b": {"H100": (32, "any")}, "c": {"RTX-PRO-6000": (16, "any")},
           "ac": {"RTX-PRO-6000": (16, "trainer"), "RTX-A6000": (32, "rollout")}}
GIB_CLASS = {"RTX-A6000": 48, "H100": 80, "RTX-PRO-6000": 96}  # the paper's "48 GB", "80 GB", "96 GB"
MODEL = {"hunyuan": "hunyuanvideo-13b", "wan14b": "wan2.1-14b", "flux": "flux.1-12b", "qwen": "qwen-image-20b"}


def test_workstation_devices_scale_as_their_data_sheets():
    """An H200 compute-bound second on each new part takes the ratio of dense bf16 peaks, a
    memory-bound second the ratio of bandwidths; neither card has an NVLink switch."""
    h200 = get_device("H200")
    for name in ("RTX-A6000", "RTX-PRO-6000"):
        d = get_device(name)
        assert float(scale_seconds(1.0, 0.0, 0.0, name)) == pytest.approx(h200.bf16_tflops / d.bf16_tflops)
        assert float(scale_seconds(0.0, 1.0, 0.0, name)) == pytest.approx(h200.hbm_gbps / d.hbm_gbps)
        assert scale_seconds(1.0, 0.0, 0.0, name).estimated and d.nvlink_gbps == 0.0
    # the Blackwell part: ~3.3x the Ampere one's dense bf16 and ~2.3x its bandwidth, twice its memory
    a, c = get_device("RTX-A6000"), get_device("RTX-PRO-6000")
    assert 3.0 < c.bf16_tflops / a.bf16_tflops < 3.5 and 2.0 < c.hbm_gbps / a.hbm_gbps < 2.5
    assert c.pcie_gbps == 2 * a.pcie_gbps  # Gen5 against Gen4


@pytest.mark.parametrize("cluster,workload", PRESETS)
def test_paper_preset_loads_as_the_paper_states_it(cluster, workload):
    tb = ablation.testbed_for(cluster, workload)
    assert tb.name == f"paper-{cluster}-{workload}" and tb.model == MODEL[workload]
    assert {p.device: (p.count, p.role) for p in tb.pools} == CLUSTER[cluster]
    for p in tb.pools:  # the memory class the paper names (usable GiB as torch reports it)
        assert GIB_CLASS[p.device] * 0.93 < get_device(p.device).hbm_gib <= GIB_CLASS[p.device]
    gbps = 400 if cluster == "b" else 200
    assert tb.links.inter_node == tb.links.inter_pool == f"ib-{gbps}g"
    assert tb.samples_per_step == 32  # the paper's mini-batch
    assert (tb.denoise_steps, tb.trained_steps) == (20, int(20 * 0.6))
    assert not tb.lora if workload == "hunyuan" else tb.lora  # DanceGRPO full, Flow-GRPO LoRA (guesses)


@pytest.mark.parametrize("cluster,workload", PRESETS)
def test_paper_preset_fits_where_the_paper_ran_it(cluster, workload):
    """The planner's own check holds the training state (workload.refusal with memory=True), and
    one rollout worker of the rollout GPUs holds the generator at the preset's batch."""
    cm = default_cost_model()
    tb = ablation.testbed_for(cluster, workload)
    assert refusal(tb, cm, memory=True) is None
    pool = (tb.pool("rollout") or tb.pools)[0]
    rep = cm.fits(tb.model, ["rollout"], pool.device, gen_batch=tb.rollout_batch, cfg=tb.cfg, shape=tb.shape)
    assert rep.fits, (rep.other_peak_gib, rep.usable_gib)


def test_sweep_settings_are_the_papers():
    for steps in ablation.STEPS:
        for fraction in ablation.FRACTIONS:
            tb = ablation.testbed_for("b", "flux", steps, fraction)
            assert tb.denoise_steps == steps and tb.trained_steps == int(round(steps * fraction))
            assert tb.trained_steps < steps  # the last step stays ODE
    assert (ablation.STEPS, ablation.FRACTIONS) == ((20, 30, 40), (0.4, 0.6))


def test_ablation_rows_name_modes_that_exist():
    from digenrl.sched import MODES
    from digenrl.sim.report import ROWS

    labels = [r.label for r in ablation.ABLATION]
    assert len(set(labels)) == len(labels)
    for row in ablation.ABLATION:
        assert row.mode in ROWS and ROWS[row.mode][0] in MODES and ROWS[row.mode][1] is None, row
    for label in ablation.BASELINE_ROWS:
        assert label in ROWS
    # the cumulative ladder, in the paper's order
    assert [r.mode for r in ablation.ABLATION[:4]] == ["disagg-sync", "gap", "gap+tsp", "gap+tsp+tag"]
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    for row in ablation.ABLATION:  # a row runs exactly when its fixed fields exist (and it is not retired)
        why = ablation.runnable(row)
        expected = all(k in fields for k in row.fixed) and not (row.unless and row.unless in fields)
        assert (why is None) == expected, (row, why)
    # the stand-in row and the rows it stands in for never run together
    bts = next(r for r in ablation.ABLATION if r.label == "+BTS")
    stand_in = next(r for r in ablation.ABLATION if r.unless)
    assert (ablation.runnable(bts) is None) != (ablation.runnable(stand_in) is None)

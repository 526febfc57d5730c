"""The load peak in the memory model (sim/memory.load_gib, FitReport.load_peak_gib): a trainer
gang rank holds its shards plus one block while it loads; the whole-model path it replaced held
the whole fp32 model, which no 80 GB part holds for Qwen-Image; a plan whose load does not fit
is refused like one whose training does not."""

from __future__ import annotations

import pytest

from digenrl.sim.catalogue import GIB
from digenrl.sim.costs import CostModel
from digenrl.sim.memory import Memory, fits_memories, load_gib

QWEN = 20.430e9  # qwen-image-20b: parameters, 60 blocks


def test_load_by_hand():
    # full fine-tune, gang of 4: fp32 masters 4 * 20.43e9 / 4 = 19.03 GiB; one block in fp32
    # 4 * 20.43e9 / 60 = 1.27 GiB
    held, transient = load_gib(QWEN, 60, 4)
    assert held == pytest.approx(4 * QWEN / 4 / GIB)
    assert transient == pytest.approx(4 * QWEN / 60 / GIB)
    # the whole-model path: every rank builds all 81.7 GB in fp32, 76.1 GiB, and shards it block by
    # block, + the larger of one bf16 block read (2 * 20.43e9 / 60) and one block's fp32 shard
    # copied out beside it (4 * 20.43e9 / 60 / 4): 76.1 + 0.63 = 76.8 GiB, which no 80 GB part
    # holds beside its CUDA context
    held_w, transient_w = load_gib(QWEN, 60, 4, loader="whole")
    assert held_w + transient_w == pytest.approx((4 * QWEN + 2 * QWEN / 60) / GIB)
    assert load_gib(QWEN, 60, 1, loader="whole")[1] + 4 * QWEN / GIB / 1 == pytest.approx(4 * QWEN * (1 + 1 / 60) / GIB)
    # LoRA: the base is cast to bf16 before sharding: the peak is the fp32 build (+ one block read)
    held_lw, transient_lw = load_gib(QWEN, 60, 4, adapters=0.1e9, loader="whole")
    assert held_lw + transient_lw == pytest.approx((4 * (QWEN + 0.1e9) + 2 * QWEN / 60) / GIB)
    # LoRA: the base in bf16 / 4, adapters in fp32 / 4
    held_l, _ = load_gib(QWEN, 60, 4, adapters=0.1e9)
    assert held_l == pytest.approx((2 * QWEN + 4 * 0.1e9) / 4 / GIB)
    with pytest.raises(ValueError, match="loader"):
        load_gib(QWEN, 60, loader="lazy")


def test_a_load_that_does_not_fit_is_refused():
    fits = Memory(weights=10.0, activations=5.0)
    assert fits_memories("H100", {"trainer": fits}).fits
    report = fits_memories("H100", {"trainer": Memory(weights=10.0, activations=5.0, load=70.0)})
    assert report.load_peak_gib == pytest.approx(80.0)
    assert report.peak_gib == report.load_peak_gib and not report.fits


def test_qwen_image_gang_of_4_loads_on_80gb_only_sharded():
    cm = CostModel()
    report = cm.fits("qwen-image-20b", ["trainer"], "H100", fsdp_shards=4, gang=True, offload=True)
    trainer = report.roles["trainer"]
    assert trainer.load == pytest.approx(4 * QWEN / 60 / GIB, rel=1e-3)  # one block: the sharded loader
    assert report.load_peak_gib < report.usable_gib
    held, transient = load_gib(QWEN, 60, 4, loader="whole")
    assert held + transient > report.usable_gib  # what the whole-model path needed

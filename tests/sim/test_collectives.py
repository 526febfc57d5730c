"""Transfer costs: traffic counted by hand, object-store legs that add up, each leg charged once."""

import pytest

from digenrl.sched import OptimizerStep, WeightSync
from digenrl.sim.catalogue import LINKS, lora_params_B
from digenrl.sim.collectives import (allgather_traffic, allreduce_s, allreduce_traffic, broadcast_traffic,
                                     object_store_fanout_s, object_store_hops, object_store_send_s, pcie_s)
from digenrl.sim.costs import CostModel
from digenrl.sim.workload import RunSpec
from digenrl.sim.testbed import load_testbed
from digenrl.sim.workload import config_for, duration_fn


@pytest.fixture(scope="module")
def cm():
    return CostModel()


def test_traffic_by_hand():
    # 8 ranks, 10 GB. Ring all-reduce: each rank sends 2 * 7/8 * 10 GB = 17.5 GB in 2 * 7 steps;
    # all-gather half the bytes, 7 steps per chunk (40 layer-by-layer chunks: 280).
    assert allreduce_traffic(10e9, 8) == (17.5e9, 14)
    assert allgather_traffic(10e9, 8, chunks=40) == (8.75e9, 280)
    assert broadcast_traffic(10e9, 3) == (10e9, 3)
    assert allreduce_traffic(10e9, 1) == (0.0, 0) and broadcast_traffic(10e9, 0) == (0.0, 0)
    # ib-400g: 40 GB/s effective, 20 us per message
    assert LINKS["ib-400g"].gbps == 40.0 and LINKS["ib-400g"].latency_s == 20e-6
    assert allreduce_traffic(10e9, 8).seconds("ib-400g") == pytest.approx(17.5e9 / 40e9 + 14 * 20e-6)


def test_object_store_legs_by_hand(cm):
    gb = 1e9
    # sender: device->host at the H200's 55 GB/s PCIe + one host copy at 10 GB/s
    assert object_store_send_s(gb, "H200") == pytest.approx(1 / 55 + 1 / 10)
    assert pcie_s(gb, "L40S") == pytest.approx(1 / 27.5)  # PCIe Gen4
    # 20 receivers, 8 per node -> 3 nodes; binary tree from the store's node: ceil(log2(3 + 1)) = 2 hops,
    # each over IB at half its 40 GB/s (TCP) + 20 us
    assert object_store_hops(20, 8) == 2
    assert object_store_fanout_s(gb, "ib-400g", 20, 8) == pytest.approx(2 * (1 / 20 + 20e-6))
    t = cm.weight_sync_s(gb, "ib-400g", 20, "object-store", "H200", "L40S", 8)
    assert float(t) == pytest.approx(1 / 55 + 1 / 10 + 2 * (1 / 20 + 20e-6) + 1 / 27.5) and t.estimated


def test_object_store_sender_leg_is_charged_once(cm):
    # small-h200x16-sd35: SD3.5-medium LoRA rank 32, lora-only sync (object-store path), gap mode
    # splits 16 H200 into 8 rollout (one node) + 8 trainers (one node, NVLink).
    tb = load_testbed("small-h200x16-sd35")
    cfg = config_for(tb, RunSpec("gap"), 4)  # the config that runs it: 8 rollout + 8 trainer workers
    fn = duration_fn(cfg, tb, cm)
    nbytes = 2 * 32 * 2 * 1536 * 192  # bf16 * rank * (d_in + d_out) * 192 adapted matrices = 37.7 MB
    assert cm.weight_bytes(tb.model, lora=True, rank=32) == pytest.approx(nbytes, abs=1)
    rollout = next(w for w in fn.layout.workers if w.role == "rollout")
    trainer = next(w for w in fn.layout.workers if w.role == "trainer")
    # Rollout side: one tree hop to its node (ceil(log2 2) = 1) at 20 GB/s + 20 us, then host->device.
    assert fn(rollout, WeightSync(1)) == pytest.approx(nbytes / 20e9 + 20e-6 + nbytes / 55e9, rel=1e-6)
    # Trainer side: gradient all-reduce + AdamW (LoRA state fits: unsharded) + the sender's leg,
    # device->host at 55 GB/s and the store copy at 10 GB/s. The all-reduce is the runtime's
    # (digenrl.sim.gangs): one fp32 mask element per trainable tensor (24 blocks: one flat adapter
    # tensor each in the catalogue layout) + the gradient sums, float64 under train.grad_sum=auto
    # for LoRA's 28M parameters (digenrl.math.grad_sum).
    p_B = lora_params_B(tb.model, 32)
    grad_bytes = 4 * 24 + 8 * round(p_B * 1e9 / 24) * 24
    others = float(allreduce_s(grad_bytes, 8, "nvlink")) + float(cm.optimizer_step_s(p_B, "H200"))
    assert fn(trainer, OptimizerStep(0, 1)) - others == pytest.approx(nbytes / 55e9 + nbytes / 10e9, rel=1e-6)


def test_relay_chain_by_hand(cm):
    # 4 receivers, 1 GB: trainer 0's NIC and r1..r3 each send the payload once, the tail nothing;
    # every link of the chain carries it once. The last receiver has it after 1 GB at 40 GB/s,
    # 3 more 1 MiB chunks and 4 latencies of 20 us.
    from digenrl.sim.collectives import (RELAY_CHUNK_BYTES, broadcast_candidates_s, relay_chain_links,
                                         relay_chain_s, relay_chain_sends)

    gb = 1e9
    assert relay_chain_sends(gb, 4) == [gb, gb, gb, gb, 0.0] and relay_chain_links(gb, 4) == [gb] * 4
    assert relay_chain_sends(gb, 0) == [0.0] and relay_chain_links(gb, 0) == []
    assert RELAY_CHUNK_BYTES == 1 << 20
    chain = gb / 40e9 + 3 * (1 << 20) / 40e9 + 4 * 20e-6
    assert float(relay_chain_s(gb, "ib-400g", 4)) == pytest.approx(chain)
    # nccl WeightSync: the chain, then the receiver's own host->device load over its PCIe (L40S: Gen4)
    assert float(cm.weight_sync_s(gb, "ib-400g", 4, "nccl", "H200", "L40S")) == pytest.approx(chain + gb / 27.5e9)
    # the candidates: NCCL's ring is the same chain in 512 KiB steps; a binomial tree sends the
    # whole payload in ceil(log2(5)) = 3 rounds
    c = broadcast_candidates_s(gb, "ib-400g", 4)
    assert c["chain"] == pytest.approx(chain)
    assert c["nccl-ring"] == pytest.approx(gb / 40e9 + 3 * (512 << 10) / 40e9 + 4 * 20e-6)
    assert c["binomial"] == pytest.approx(3 * (gb / 40e9 + 20e-6))


def test_nccl_publish_is_the_device_to_host_staging(cm):
    # h200x16-flux (FLUX.1 12B full fine-tune, one-GPU trainers): under nccl the trainer's side of
    # a publish is the bf16 weights device->host into the relay's pinned buckets (55 GB/s); under
    # object-store it is that plus the copy into the store (10 GB/s). Everything else is equal.
    from dataclasses import replace

    tb = load_testbed("h200x16-flux")
    fns = {ws: duration_fn(config_for(replace(tb, weight_sync=ws), RunSpec("gap"), 4), replace(tb, weight_sync=ws), cm)
           for ws in ("nccl", "object-store")}
    trainer = {ws: next(w for w in fn.layout.workers if w.role == "trainer") for ws, fn in fns.items()}
    nbytes = cm.weight_bytes(tb.model)
    diff = fns["object-store"](trainer["object-store"], OptimizerStep(0, 1)) - fns["nccl"](trainer["nccl"], OptimizerStep(0, 1))
    assert diff == pytest.approx(nbytes / 10e9, rel=1e-6)
    rollout = next(w for w in fns["nccl"].layout.workers if w.role == "rollout")
    n = sum(1 for w in fns["nccl"].layout.workers if w.role == "rollout")
    from digenrl.sim.collectives import relay_chain_s

    assert fns["nccl"](rollout, WeightSync(1)) == pytest.approx(
        float(relay_chain_s(nbytes, "ib-400g", n)) + nbytes / 55e9, rel=1e-6)

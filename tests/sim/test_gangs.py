"""sim.gangs: the FSDP byte formulas against FSDP2 itself, and predict_comm over a schedule.

The strongest check runs the collectives: 2 CPU ranks (gloo) shard a tiny DiT with
`shard_policy`, count bytes with `CommCounter` + `count_fsdp`, and run one Train unit,
one Generate unit, an optimizer-step reshard and a publish gather exactly as the runtime
contract says a gang does; every counter must EQUAL GangComm's prediction. The
hand-computed numbers (gangs.md) pin the formulas themselves.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import os

import torch
import yaml
import torch.distributed as dist

from digenrl.config.schema import dump_config, load_config
from digenrl.config.contract import contract
from digenrl.math.grad_sum import grad_sum_bytes
from digenrl.models.lora import LoraSpec, apply_lora, trainable_state_dict
from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiT, TinyDiTConfig, TinyDiTPolicy
from digenrl.sched import Scheduler
from digenrl.sim.catalogue import GIB
from digenrl.sim.costs import default_cost_model as cost_model
from digenrl.sim.engine import run_virtual
from digenrl.sim.memory import GANG_GATHERED_BLOCKS
from digenrl.sim.gangs import (GangComm, ModelLayout, catalogue_layout, key, layout_for, module_layout,
                               predict_comm)
from digenrl.sim.report import run_spec
from digenrl.sim.workload import RunSpec
from digenrl.sim.simulate import simulate
from digenrl.sim.testbed import list_presets, load_testbed
from digenrl.sim.workload import config_for, fitting_gang, refusal, trainer_fit
from tests.helpers.ranks import spawn_ranks

WORLD = 2
TINY = TinyDiTConfig(image_size=8, dim=32, depth=2, heads=2)


def _module(lora_rank: int, device: str = "cpu") -> TinyDiT:
    with torch.device(device):
        torch.manual_seed(0)
        module = TinyDiT(TINY)
        if lora_rank:
            module.requires_grad_(False)
            apply_lora(module, LoraSpec(lora_rank, 2.0 * lora_rank, LORA_TARGETS))
    return module


def _layout(lora_rank: int, param_bytes: int = 4) -> ModelLayout:
    m = _module(lora_rank, "meta")
    return module_layout(m, param_bytes, trainable_state_dict(m))


# ----------------------------------------------------------------------------- formulas


def test_full_gather_is_padded_numel_times_gang():
    lay = _layout(0)
    assert lay.numel == 46096  # gangs.md: full FT params
    # unpadded would be 46096 * 4 = 184384; ceil(dim0/2) on odd-dim0 tensors pads to 185408
    assert lay.all_gather_bytes(2) == 185408
    assert lay.reduce_scatter_bytes(2) == 185408  # fp32 model: same tensors, fp32 reduce
    assert lay.all_gather_bytes(1) == 0 and lay.reduce_scatter_bytes(1) == 0  # a gang of one moves nothing


def test_lora_reduce_scatter_covers_adapters_only():
    lay = _layout(4)
    assert (lay.numel, lay.trainable_numel) == (50192, 4096)
    assert lay.reduce_scatter_bytes(2) == 16384  # 4096 fp32 adapter elements, even dim0: no padding
    assert len([u for u in lay.units if u.trainable]) == 2  # the root holds no adapter: 2 RS calls
    # cross-gang all-reduce per rank: 16 adapter tensors (2 blocks x 4 targets x A, B) in the
    # mask, + the local shard: per block A (4,32)->2*32 x3 + (4,128)->2*128, B (96,4)->48*4,
    # (32,4)->16*4 x2, (128,4)->64*4 = 64*3 + 256 + 192 + 64*2 + 256 = 1024; two blocks 2048
    assert lay.cross_gang_bytes(2) == 4 * (16 + 2048)
    assert lay.cross_gang_bytes(1) == 4 * (16 + 4096)
    assert lay.payload_bytes == 4096 * 4  # the relay sends adapters only, model dtype


def test_catalogue_layout_splits_params_over_blocks():
    flux = catalogue_layout("flux.1-12b", param_bytes=2)
    assert len(flux.units) == 57 and abs(flux.numel - 11.901e9) < 57
    # 16 ranks: a full gather is the bf16 model on each rank, padding below 16 elements per block
    assert 0 <= flux.all_gather_bytes(16) - 2 * flux.numel < 57 * 16 * 2
    assert 0 <= flux.reduce_scatter_bytes(16) - 4 * flux.numel < 57 * 16 * 4
    lora = catalogue_layout("flux.1-12b", lora=True, rank=32)
    assert lora.trainable_numel == pytest.approx(32 * 2 * 3072 * (19 * 8 + 38 * 4), rel=1e-6)
    assert lora.reduce_scatter_bytes(8) == pytest.approx(4 * lora.trainable_numel, rel=1e-6)


def test_train_passes_follow_rank_zero_rows():
    comm = GangComm(_layout(0), gang=2, gangs=1, after_step=False, backward_batch=2, ref_forward=False)
    # 5 rows over 2 ranks: rank 0 gets 3 -> 2 chunks of <= 2 per trained step; 3 trained steps
    assert comm.passes(5, 3) == 6
    ag, rs = comm.train(5, 3, gathered=False)
    assert ag == 6 * 2 * 2 * 185408  # passes x (forward + backward) x ranks x one gather
    assert comm.defers_reduction  # a small gradient: reduce-scattered once per unit, after its last pass
    assert rs == 1 * 2 * 185408
    step = GangComm(_layout(0), gang=2, gangs=1, after_step=True, backward_batch=2, ref_forward=False)
    assert step.train(5, 3, gathered=False) == (2 * 185408, rs)
    # TSP's packed passes: rank 0's 3 rows x 3 steps = 9 pairs in passes of 4 -> 3 passes
    packed = GangComm(_layout(0), gang=2, gangs=1, after_step=False, backward_batch=0, ref_forward=False,
                      pairs_per_pass=4)
    assert packed.passes(5, 3) == 3 and packed.train(5, 3, gathered=False) == (3 * 2 * 2 * 185408, rs)
    # a 12B full fine-tune holds no unsharded gradient across passes: it reduces after each
    big = GangComm(catalogue_layout("flux.1-12b", lora=False), gang=8, gangs=1, after_step=False, backward_batch=1,
                   ref_forward=False)
    assert not big.defers_reduction
    assert big.train(16, 2, gathered=False)[1] == 2 * 2 * 8 * big.layout.reduce_scatter_bytes(8)
    assert step.train(5, 3, gathered=True) == (0, rs)


def test_nft_old_policy_forward_gathers_once_more_per_pass():
    # train.nft_decay: v_old is one more no-grad forward per pass (learner._nft_loss), so after-forward
    # resharding gathers every unit 3 times a pass instead of 2; after-step is refused with it
    comm = GangComm(_layout(0), gang=2, gangs=1, after_step=False, backward_batch=2, ref_forward=False,
                    old_forward=True)
    ag, rs = comm.train(5, 3, gathered=False)
    assert ag == 6 * 3 * 2 * 185408 and rs == 1 * 2 * 185408  # one reduce-scatter per unit (small gradient)


# ----------------------------------------------------------------------------- measured


CASES = {  # (lora_rank, reshard after-step, KL reference forward, bf16 gathers)
    "full-after-forward": (0, False, False, False),
    "full-after-step-bf16": (0, True, False, True),
    "lora-kl": (4, False, True, False),
    "lora-after-step-kl-bf16": (4, True, True, True),
}
ROWS, BB, T_STEPS, GEN_STEPS = 5, 2, 2, 3  # one Train unit of 5 rows, backward_batch 2, 2 trained steps


def _gang_run(counter, lora_rank: int, after_step: bool, kl: bool, bf16: bool) -> dict:
    """One gang's contract sequence on a freshly sharded module: a Train unit, a Generate
    unit, an optimizer-step reshard, a publish gather. One rank's counters per phase."""
    from torch.distributed.device_mesh import init_device_mesh

    from digenrl.learner.comm import count_fsdp, fsdp_units
    from digenrl.learner.sharded import shard_policy
    from digenrl.models.lora import adapters_disabled

    module = _module(lora_rank)
    shard_policy(TinyDiTPolicy(module), init_device_mesh("cpu", (WORLD,)), reshard_after_forward=not after_step,
                 mixed_precision=bf16)
    units = fsdp_units(module)
    if after_step:
        for u in units:
            u.set_reshard_after_backward(False)
    count_fsdp(module, counter)
    chunks = -(-(-(-ROWS // WORLD)) // BB)  # rank 0's rows in chunks; rank 1 runs ghost passes to match
    tok = torch.zeros(BB, 8, dtype=torch.long)
    x, sigma = torch.randn(BB, 3, 8, 8), torch.rand(BB)
    out = {}
    passes = T_STEPS * chunks
    with counter.phase("train"):
        for i in range(passes):
            # learner.Learner._reduce_once: a small gradient is reduce-scattered after the unit's last pass
            module.set_requires_gradient_sync(i == passes - 1)
            v = module(x, sigma, tok)
            if kl:
                with torch.no_grad(), adapters_disabled(module):
                    module(x, sigma, tok)
            v.float().square().mean().backward()
    out["train"] = counter.take()
    with counter.phase("generate"), torch.no_grad():
        for _ in range(GEN_STEPS):
            module(x, sigma, tok)
    out["generate"] = counter.take()
    for u in units:  # the optimizer step reshards every unit (the root's reshard() alone
        u.reshard()  # frees only the root: the blocks would stay gathered, and stale)
    with counter.phase("generate"), torch.no_grad():
        module(x, sigma, tok)  # the first forward after a reshard gathers again
    out["after_reshard"] = counter.take()
    for u in units:
        u.reshard()
    with counter.phase("publish"):  # publish: unshard every unit once, then reshard
        for u in units:
            u.unshard()
        for u in units:
            u.reshard()
    out["publish"] = counter.take()
    return out


def _worker(rank: int, tmp: str) -> None:
    from digenrl.learner.comm import CommCounter

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    try:
        out = {name: _gang_run(CommCounter(), *case) for name, case in CASES.items()}
        if rank == 0:
            torch.save(out, f"{tmp}/counts.pt")
        dist.barrier()  # no rank tears gloo down while another still talks to it (SIGABRT at exit)
    finally:
        dist.destroy_process_group()
    # success: leave without interpreter teardown, where gloo's threads aborted a rank
    # ('terminate called without an active exception') on clean CI clones
    os._exit(0)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gang")
    spawn_ranks(_worker, (str(tmp),), WORLD)
    return torch.load(tmp / "counts.pt")


@pytest.mark.parametrize("case", CASES)
def test_counted_bytes_equal_prediction(measured, case):
    lora_rank, after_step, kl, bf16 = CASES[case]
    got = measured[case]
    comm = GangComm(_layout(lora_rank, 2 if bf16 else 4), gang=WORLD, gangs=1, after_step=after_step,
                    backward_batch=BB, ref_forward=kl)
    ag, rs = comm.train(ROWS, T_STEPS, gathered=False)
    # counters are one rank's; the prediction sums the gang's ranks (every rank issues the same)
    assert got["train"][key("train", "all_gather")] * WORLD == ag
    assert got["train"][key("train", "reduce_scatter")] * WORLD == rs
    assert got["generate"].get(key("generate", "all_gather"), 0) * WORLD == comm.generate(GEN_STEPS, gathered=True)
    assert got["after_reshard"][key("generate", "all_gather")] * WORLD == comm.generate(1, gathered=False)
    assert got["publish"][key("publish", "all_gather")] * WORLD == comm.gather
    assert ag > 0 and rs > 0


# ----------------------------------------------------------------------------- over a schedule


def _cfg(*overrides):
    base = ["run.mode=gap+tsp", "model.name=tiny-dit", "data.groups_per_step=4", "data.group_size=2",
            "data.micro_batch_groups=1", "sampling.num_steps=4", "sampling.window=contiguous",
            "sampling.window_size=2", "train.steps=3", "train.backward_batch=1", "runtime.rollout.workers=1",
            "runtime.trainer.workers=2", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp",
            "runtime.weight_sync=nccl", "runtime.compute=emulated", "runtime.testbed=h200x16-flux",
            "model.lora_rank=0"]
    return load_config(None, base + list(overrides))


def _trace(cfg):
    run = contract(cfg)
    return run_virtual(Scheduler(run.sched, run.workers()), lambda w, u: 1.0)


def test_predict_comm_over_a_schedule():
    cfg = _cfg()
    lay = layout_for(cfg)
    g1 = lay.all_gather_bytes(2)  # one gather of every unit, one rank
    steps = predict_comm(cfg, _trace(cfg))
    assert len(steps) == 3
    for s in steps:
        # 4 micro-batches of 2 rows x 2 trained steps, tsp_chunk 1: 8 Train units per step, each
        # 1 row per rank (bb 1) -> 1 pass: forward + backward gathers, one backward reduce-scatter
        assert s[key("train", "all_gather")] == 8 * 2 * 2 * g1
        assert s[key("train", "reduce_scatter")] == 8 * 2 * lay.reduce_scatter_bytes(2)
        # 2 gangs (of 2 ranks); the tiny DiT's gradients are summed in float64 (train.grad_sum=auto)
        assert s[key("train", "all_reduce")] == 2 * lay.gang_cross_gang_bytes(2, 8)
        assert s[key("publish", "all_gather")] == 2 * g1  # trainer-0's two ranks
        assert s[key("generate", "all_gather")] == 0  # no TAG in gap+tsp
    # one rollout worker pulls every new version but the last: 2 sends of the full model (fp32)
    assert lay.payload_bytes == lay.numel * 4
    assert sum(s[key("sync", "send")] for s in steps) == 2 * lay.payload_bytes


def test_predict_comm_after_step_gathers_once_per_gang_and_step():
    cfg = _cfg("runtime.trainer.reshard=after-step", "run.mode=digenrl", "model.lora_rank=4")
    lay = layout_for(cfg)
    steps = predict_comm(cfg, _trace(cfg))
    for s in steps:
        # after-step: one gather per gang and step, whether a Train or a TAG Generate came first
        assert s[key("train", "all_gather")] + s[key("generate", "all_gather")] == 2 * 2 * lay.all_gather_bytes(2)
        assert s[key("train", "reduce_scatter")] == 8 * 2 * lay.reduce_scatter_bytes(2)
    assert sum(s[key("sync", "send")] for s in steps) > 0
    assert steps[0][key("sync", "send")] % lay.payload_bytes == 0  # adapters only


def test_gang_of_one_counts_only_the_cross_gang_reduction():
    cfg = _cfg("runtime.trainer.gang=1", "runtime.trainer.shard=none")
    lay = layout_for(cfg)
    for s in predict_comm(cfg, _trace(cfg)):
        assert s[key("train", "all_gather")] == s[key("train", "reduce_scatter")] == s[key("publish", "all_gather")] == 0
        assert s[key("train", "all_reduce")] == 2 * (4 * lay.trainable_tensors + 8 * lay.numel)  # float64 sums


def test_grad_sum_sets_the_all_reduce_element():
    """train.grad_sum: float64 sums (auto, up to 2^28 trainable parameters) double the gradient
    part of the all-reduce; float32 keeps it at 4 bytes; the fp32 mask is 4 bytes either way."""
    for choice, nbytes in (("auto", 8), ("float64", 8), ("float32", 4)):
        cfg = _cfg("runtime.trainer.gang=1", "runtime.trainer.shard=none", f"train.grad_sum={choice}")
        lay = layout_for(cfg)
        for s in predict_comm(cfg, _trace(cfg)):
            assert s[key("train", "all_reduce")] == 2 * (4 * lay.trainable_tensors + nbytes * lay.numel)
    # auto: float64 up to 2^28 trainable parameters (LoRA adapters), float32 beyond (a 12B full FT)
    assert grad_sum_bytes("auto", 2**28) == 8 and grad_sum_bytes("auto", 12 * 10**9) == 4


# ----------------------------------------------------------------------------- presets and plans


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_maps_to_a_runnable_config_that_fits(preset):
    tb = load_testbed(preset)
    assert refusal(tb) is None
    split = tb.split_pool
    n_rollout = tb.n_gpus // 2 if split else None
    trainers = tb.n_gpus - n_rollout if split else sum(p.count for p in tb.pool("trainer"))
    for reshard in ("after-forward", "after-step"):
        cfg = config_for(tb, RunSpec("digenrl", n_rollout=n_rollout, reshard=reshard), 3)
        t = cfg.runtime.trainer
        assert t.workers * t.gang == trainers and (t.gang == 1 or t.shard == "fsdp")
        # the written YAML loads back to the same gang keys (what `digenrl train --config` reads)
        again = load_config(None, tree=yaml.safe_load(dump_config(cfg))).runtime.trainer
        assert (again.gang, again.shard, again.reshard) == (t.gang, t.shard, reshard)
        gang, rep = trainer_fit(tb, trainers, after_step=reshard == "after-step")
        assert gang == t.gang  # the config's gang is the smallest that holds the state ...
        assert rep.fits and rep.peak_gib * GIB <= 141e9  # ... and it fits in one H200's 141 GB
    assert t.gang == 1 or not tb.lora  # LoRA states fit on one H200; full fine-tunes need gangs


def test_full_finetunes_need_a_gang_and_the_memory_model_says_why():
    tb = load_testbed("h200x16-flux")
    assert fitting_gang(tb, 8) == 2  # 16 B/param x 11.9B = 177 GiB on one GPU; ~89 + activations on two
    one = cost_model().fits(tb.model, ["trainer"], "H200", train_batch=tb.micro_batch, grad_ckpt=True,
                            shape=tb.shape, fsdp_shards=1)
    assert not one.fits
    # after-step holds the gathered bf16 model (2 B/param) on every rank: more memory than after-forward
    fwd = cost_model().memory_gib(tb.model, "trainer", "H200", batch=2, fsdp_shards=2, gang=True, shape=tb.shape)
    step = cost_model().memory_gib(tb.model, "trainer", "H200", batch=2, fsdp_shards=2, gang=True, shape=tb.shape,
                                   after_step=True)
    off = cost_model().memory_gib(tb.model, "trainer", "H200", batch=2, fsdp_shards=2, gang=True, shape=tb.shape,
                                  offload=True)
    p = 11.901e9
    assert step.weights - fwd.weights == pytest.approx((2 * p - GANG_GATHERED_BLOCKS * 2 * p / 57) / GIB, rel=1e-6)
    assert fwd.grads == pytest.approx(4 * p / 2 / GIB) and fwd.optimizer == pytest.approx(8 * p / 2 / GIB)
    assert off.optimizer == 0.0


def test_simulate_lists_a_row_no_gang_can_hold_instead_of_refusing():
    """Issue 24: a row that does not fit says so with the memory figure; the testbed is not refused."""
    tb = load_testbed("hetero-h200x8-l40sx16-wan14b")
    tiny = replace(tb, pools=(replace(tb.pools[0], count=1), tb.pools[1]))  # one H200 trainer for a 14B full FT
    assert refusal(tiny) is None
    why = refusal(tiny, memory=True)
    assert why and "no trainer gang holds" in why
    rep = simulate(tiny, modes=("digenrl",), steps=4)
    assert "digenrl" not in rep.rows and "GiB per GPU" in rep.unfit["digenrl"]
    assert "does not fit" in rep.table()


def test_gang_collectives_cost_time_and_are_reported():
    tb = load_testbed("h200x16-wan14b")
    r = run_spec(tb, RunSpec("gap+tsp", n_rollout=8), 4, keep_trace=True)
    assert r.fn.gang == 2 and r.breakdown_s["comm"] > 0  # exposed first-unit gathers at least
    # after-step gathers once per step: less exposed communication than after-forward
    s = run_spec(tb, RunSpec("gap+tsp", n_rollout=8, reshard="after-step", gang=4), 4)
    f = run_spec(tb, RunSpec("gap+tsp", n_rollout=8, gang=4), 4)
    assert s.breakdown_s["comm"] < f.breakdown_s["comm"]


def test_dpo_charges_its_reference_forward():
    # train.loss=dpo scores every pair under the reference too (learner._dpo_loss): under LoRA on
    # a gang one more gather per pass, and a reference forward per trained chunk in the testbed
    # the durations price, as train.beta > 0 charges the KL's; flow-dppo issues grpo's passes
    from digenrl.config.schema import load_config
    from digenrl.sim.testbed import load_testbed
    from digenrl.sim.workload import testbed_for

    gangs = ["run.mode=gap+tsp", "runtime.trainer.workers=2", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp"]
    dpo = load_config(None, [*gangs, "train.loss=dpo", "model.lora_rank=4"])
    assert GangComm.from_config(dpo, _layout(4)).ref_forward
    assert not GangComm.from_config(load_config(None, [*gangs, "train.loss=flow-dppo", "model.lora_rank=4"]),
                                    _layout(4)).ref_forward
    tb = load_testbed("small-h200x16-sd35")
    dpo_tb = testbed_for(load_config("recipes/sd35_dpo_pickscore.yaml"), tb)
    dppo_tb = testbed_for(load_config("recipes/sd35_flow_dppo_pickscore.yaml"), tb)
    assert dpo_tb.kl and not dppo_tb.kl
    # the pair forwards: a unit of 2 groups of 24 trains 2 x 2 rows (best-worst), margin at most every pair's
    assert (dpo_tb.pair_rows, dpo_tb.trained_rows(48), dppo_tb.trained_rows(48)) == (2, 4, 48)
    margin = load_config("recipes/sd35_dpo_pickscore.yaml", ["train.dpo_pairs=margin", "train.dpo_margin=0.5"])
    assert testbed_for(margin, tb).trained_rows(24) == 24 * 23
    # priced: dpo's ideal train work is its 2 rows of 24 per group, plus the reference forward
    from digenrl.sim.report import useful_work

    every = useful_work(replace(dpo_tb, pair_rows=0), "H200")["train"]
    pairs = useful_work(dpo_tb, "H200")["train"]
    assert 0 < pairs < every / 6

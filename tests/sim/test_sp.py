"""sim.sp: the Ulysses byte contract by hand, sequence-parallel gangs in the time, memory and
byte models, the planner's choice of degree, and the refusals.

The hand counts follow the contract in sim/sp.py's docstring; the runtime's counters are
compared with the same functions in the runtime's own tests.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from digenrl.config.errors import ConfigError
from digenrl.config.schema import dump_config, load_config
from digenrl.config.contract import contract
from digenrl.sched import Scheduler
from digenrl.sim.catalogue import GIB, MODELS, Shape, get_model
from digenrl.sim.costs import default_cost_model as cost_model
from digenrl.sim.engine import run_virtual
from digenrl.sim.gangs import catalogue_layout, key, predict_comm
from digenrl.sim.planner import plan, snap
from digenrl.sim.report import ideal_step_s, run_spec
from digenrl.sim.workload import RunSpec
from digenrl.sim.simulate import simulate
from digenrl.sim.sp import (CATALOGUE, SpDims, forward_bytes, gang_generate_bytes, image_tokens_for,
                            rank_flops_fraction, train_unit_bytes)
from digenrl.sim.testbed import Testbed, load_testbed
from digenrl.sim.workload import config_for, duration_fn, refusal

# heads 2 x head_dim 4 (H*D = 8), 3 Ulysses layers, 5 joint text tokens, proj_out 8 features
TINY = SpDims(heads=2, head_dim=4, attn_layers=3, text_tokens=5, out_features=8, patch=(1, 2, 2))


# ----------------------------------------------------------------------------- the byte formula


def test_forward_bytes_by_hand():
    # b=2 samples, S=7 image tokens, P=2 -> L=4 (one pad token), bf16 (e=2)
    # all_to_all: 4 calls x 3 layers x (2 x 4 x 8) elements x 2 B = 1536
    # text gather: 3 layers x (2 x 5 x 8) x 2 B = 480; output gather: 2 x (2 x 4) x 8 x 2 B = 256
    assert forward_bytes(TINY, 2, 7, 2, 2) == {"all_to_all": 1536, "all_gather": 736, "reduce_scatter": 0}
    # backward: the all-to-alls again, the text gather's backward a reduce-scatter of its size
    assert forward_bytes(TINY, 2, 7, 2, 2, backward=True) == {"all_to_all": 3072, "all_gather": 736,
                                                              "reduce_scatter": 480}
    # checkpointing recomputes the blocks' forward (a2a, text gathers), not the output gather
    assert forward_bytes(TINY, 2, 7, 2, 2, backward=True, recompute=True) == {
        "all_to_all": 4608, "all_gather": 1216, "reduce_scatter": 480}
    # P=3: L=3 (9 tokens, two pads): a2a 4 x 3 x (2 x 3 x 8) x 2 = 1152; output 2 x 9 x 8 x 2 = 288
    assert forward_bytes(TINY, 2, 7, 3, 2) == {"all_to_all": 1152, "all_gather": 480 + 288, "reduce_scatter": 0}
    # Wan (no joint text): only the output gather besides the all-to-alls
    wan = dataclasses.replace(TINY, text_tokens=0)
    assert forward_bytes(wan, 1, 8, 2, 4) == {"all_to_all": 4 * 3 * 4 * 8 * 4, "all_gather": 8 * 8 * 4,
                                              "reduce_scatter": 0}
    # degree 1 counts nothing
    assert forward_bytes(TINY, 2, 7, 1, 2, backward=True, recompute=True) == dict.fromkeys(
        ("all_to_all", "all_gather", "reduce_scatter"), 0)


def test_dims_from_diffusers_transformers():
    from diffusers import HunyuanVideoTransformer3DModel, WanTransformer3DModel

    # the tests' tiny Wan (tests/models/tiny_diffusers.py): 2 heads of 8, one block, 4 channels
    wan = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                out_channels=4, text_dim=32, freq_dim=32, ffn_dim=32, num_layers=1,
                                rope_max_seq_len=32)
    assert SpDims.from_module(wan) == SpDims(2, 8, 1, 0, 4 * 1 * 2 * 2, (1, 2, 2))
    assert SpDims.from_module(wan).image_tokens((4, 3, 6, 10)) == 3 * 3 * 5
    hv = HunyuanVideoTransformer3DModel(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10,
                                        num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=1,
                                        patch_size_t=1, text_embed_dim=16, pooled_projection_dim=8,
                                        rope_axes_dim=(2, 4, 4))
    # double + single blocks run joint attention; the text length is the adapter's
    assert SpDims.from_module(hv, text_tokens=7) == SpDims(2, 10, 2, 7, 4, (1, 1, 1))
    assert SpDims.from_module(hv).text_tokens == 256


def test_catalogue_dims_match_the_cost_models_architecture():
    for name, d in CATALOGUE.items():
        m = MODELS[name]
        assert m.kind == "video" and d.heads * d.head_dim == m.hidden and d.attn_layers == m.layers
        assert d.text_tokens == m.text_tokens
    # 720p x 53 frames: 14 x 45 x 80 latent patches; the catalogue's sequence adds the 256 text tokens
    shape = Shape(720, 1280, 53)
    assert image_tokens_for("hunyuanvideo-13b", shape) == 14 * 45 * 80
    assert SpDims.from_catalogue("hunyuanvideo-13b", Shape(720, 1280, 53, text_tokens=128)).text_tokens == 128
    with pytest.raises(KeyError, match="no sequence-parallel attention"):
        SpDims.from_catalogue("flux.1-12b")


def test_units_summed_over_the_gang_by_hand():
    def one(b):  # one pass over b rows: training forward + backward + recompute, no KL
        return forward_bytes(TINY, b, 7, 2, 2, backward=True, recompute=True)

    # 5 rows on a gang of 4 at sp 2: 2 groups of 3 and 2 rows; backward_batch 2 -> rank 0's group
    # runs 2 passes (2 + 1 rows), the other 2 + a ghost of one row; 2 ranks per group, 3 steps
    got = train_unit_bytes(TINY, 5, 3, gang=4, degree=2, backward_batch=2, tokens=7, elem_bytes=2, cfg=False,
                           recompute=True, ref_forward=False)
    for kind in got:
        assert got[kind] == 2 * 3 * (one(2)[kind] + one(1)[kind] + one(2)[kind] + one(1)[kind])
    # CFG doubles every call's rows, a KL term adds a no-grad forward per pass
    cfg = train_unit_bytes(TINY, 1, 1, gang=2, degree=2, backward_batch=1, tokens=7, elem_bytes=2, cfg=True,
                           recompute=False, ref_forward=True)
    assert cfg["all_to_all"] == 2 * (forward_bytes(TINY, 2, 7, 2, 2, backward=True)["all_to_all"]
                                     + forward_bytes(TINY, 2, 7, 2, 2)["all_to_all"])
    # TAG Generate of 1 row on a trainer gang of 4 at sp 2: the second group runs a ghost row
    gen = gang_generate_bytes(TINY, 1, 4, gang=4, degree=2, tokens=7, elem_bytes=2, cfg=False)
    assert gen["all_to_all"] == 2 * 2 * 4 * forward_bytes(TINY, 1, 7, 2, 2)["all_to_all"]
    # a rollout gang of 4 (one group): every rank counts the unit's rows
    roll = gang_generate_bytes(TINY, 3, 2, gang=4, degree=4, tokens=7, elem_bytes=2, cfg=False)
    assert roll["all_gather"] == 4 * 2 * forward_bytes(TINY, 3, 7, 4, 2)["all_gather"]


def _sp_cfg(*overrides):
    base = ["run.mode=gap+tsp", "model.name=wan", "model.height=64", "model.width=64", "model.frames=5",
            "model.dtype=bfloat16", "model.grad_ckpt=true", "model.lora_rank=4", "data.groups_per_step=2",
            "data.group_size=2", "data.micro_batch_groups=1", "sampling.num_steps=4", "sampling.window=contiguous",
            "sampling.window_size=2", "train.steps=3", "train.backward_batch=1", "runtime.rollout.workers=1",
            "runtime.rollout.gang=2", "runtime.trainer.workers=1", "runtime.trainer.gang=2",
            "runtime.trainer.shard=fsdp", "runtime.trainer.sp=2", "runtime.compute=emulated",
            "runtime.testbed=h200x16-wan14b", "runtime.weight_sync=nccl"]
    return load_config(None, base + list(overrides))


def test_predict_comm_counts_rollout_and_trainer_sequence_parallel_bytes():
    cfg = _sp_cfg()
    run = contract(cfg)
    trace = run_virtual(Scheduler(run.sched, run.workers()), lambda w, u: 1.0)
    steps = predict_comm(cfg, trace, catalogue_layout("wan2.1-14b", lora=True, rank=4), sp_dims=TINY, sp_tokens=7)
    assert len(steps) == 3
    fb = lambda b, **kw: forward_bytes(TINY, b, 7, 2, 2, **kw)  # noqa: E731
    for s in steps:
        # rollout: 2 Generate units of 2 rows x 4 denoising steps, both ranks of the gang count
        assert s[key("generate", "all_to_all")] == 2 * 2 * 4 * fb(2)["all_to_all"]
        assert s[key("generate", "all_gather")] == 2 * 2 * 4 * fb(2)["all_gather"]
        # trainer: 2 micro-batches x 2 trained steps (tsp_chunk 1) = 4 Train units of 2 rows, one
        # data group (gang 2 = sp 2) running them 1 row per pass (backward_batch 1), both ranks
        train = fb(1, backward=True, recompute=True)
        for kind in ("all_to_all", "all_gather", "reduce_scatter"):
            extra = 0
            if kind == "all_gather":  # the FSDP gathers are in the same key
                continue
            if kind == "reduce_scatter":
                # FSDP's: once per unit after its last pass (LoRA's gradient is small)
                extra = 4 * 1 * 2 * catalogue_layout("wan2.1-14b", lora=True, rank=4).reduce_scatter_bytes(2)
            assert s[key("train", kind)] == 4 * 2 * 2 * train[kind] + extra


# ----------------------------------------------------------------------------- time and memory


def test_a_rank_computes_its_share_and_pays_the_all_to_alls():
    cm, m, shape = cost_model(), "hunyuanvideo-13b", Shape(720, 1280, 53)
    one = float(cm.denoise_s(m, "H200", 1, False, shape))
    for p in (2, 4, 8):
        frac = rank_flops_fraction(m, shape, p)
        assert 1 / p <= frac < 1 / p * 1.02  # 50k tokens: padding and the 256 text tokens are ~1%
        rank = float(cm.denoise_s(m, "H200", 1, False, shape, p))
        assert one / p <= rank < one  # never better than a perfect split (fixed costs stay whole)
    # a short sequence splits badly: the replicated text is a third of a rank's tokens at P=8
    assert rank_flops_fraction(m, Shape(256, 256, 5), 8) > 2.5 / 8


def test_sequence_parallel_gangs_cost_time_and_memory():
    tb = Testbed.from_dict(_TB)
    plain = run_spec(tb, RunSpec("gap+tsp", n_rollout=8), 4, keep_trace=True)
    sp = run_spec(tb, RunSpec("gap+tsp", n_rollout=8, rollout_gang=4, trainer_sp=2), 4, keep_trace=True)
    assert sp.fn.layout.gpus["rollout-0"] == 4 and len(sp.fn.layout.ids("rollout")) == 2
    assert sp.overhead_ws["gang_sp_generate"] > 0 and sp.overhead_ws["gang_sp_train"] > 0
    assert sp.breakdown_s["comm"] > plain.breakdown_s["comm"]
    # memory: a rollout rank holds the whole bf16 model and 1/P of the per-sample activations
    cm = cost_model()
    one = cm.memory_gib(tb.model, "rollout", batch=2, shape=tb.shape)
    four = cm.memory_gib(tb.model, "rollout", batch=2, shape=tb.shape, sp=4)
    assert four.weights == one.weights == pytest.approx(2 * get_model(tb.model).params_B * 1e9 / GIB)
    fit = cm.table[tb.model, "act_forward"]
    assert one.activations - four.activations == pytest.approx((one.activations - fit.fixed) * 3 / 4)


# ----------------------------------------------------------------------------- planner and bound

# HunyuanVideo LoRA on 16 H200, 2 prompts x 16 per step: few trajectories per GPU
_TB = dict(name="sp-test", pools=[dict(name="h", count=16, device="H200", role="any", gpus_per_node=8)],
           model="hunyuanvideo-13b", height=720, width=1280, frames=53, denoise_steps=8, trained_steps=4,
           group_size=16, groups_per_step=2, micro_batch=1, rollout_batch=2, lora=True, reward="videoalign",
           weight_sync="lora-only")


def test_planner_picks_sequence_parallelism_for_long_sequences_only():
    # 4 videos of 50k tokens per RL step on 16 GPUs: GAP's generation fragments give at most 4
    # generators a video each (with 32 videos they parallelise the step without all-to-alls, and
    # the planner prefers them); only sequence parallelism spreads one video over more GPUs
    # (gap+tsp: a rollout pool to give gangs to; with TAG the planner may make every GPU a trainer)
    long = Testbed.from_dict({**_TB, "group_size": 4, "groups_per_step": 1})
    p = plan(long, mode="gap+tsp", steps=4)
    assert p.spec.rollout_gang > 1  # one trajectory sets the pace
    without = plan(dataclasses.replace(long, rollout_gang=1, trainer_sp=1), mode="gap+tsp", steps=4)
    assert p.throughput > without.throughput
    short = Testbed.from_dict({**_TB, "height": 256, "width": 256, "frames": 5})
    q = plan(short, mode="gap+tsp", steps=4)
    assert (q.spec.rollout_gang, q.spec.trainer_sp) == (1, 1)  # 512 tokens: the fixed costs dominate
    # the plan's config names the degrees, loads back, and an emulated run's duration_fn takes it
    cfg = config_for(long, p.spec, 3)
    again = load_config(None, tree=yaml.safe_load(dump_config(cfg)))
    assert again.runtime.rollout.gang == p.spec.rollout_gang
    assert "runtime.rollout.gang" in p.spec.overrides(long)
    fn = duration_fn(again, long, cost_model())
    assert fn.rollout_gang == p.spec.rollout_gang


@pytest.mark.parametrize("mode", ["disagg-sync", "one-step-off", "gap", "digenrl"])
def test_sequence_parallel_runs_stay_within_the_ideal_bound(mode):
    tb = Testbed.from_dict({**_TB, "lora": False, "weight_sync": "nccl"})
    ideal = ideal_step_s(tb)["step_s"]
    for rg, sp in ((2, 1), (4, 2), (8, 4)):
        point = snap(tb, {"n_rollout": 8, "rollout_gang": rg, "trainer_sp": sp})
        r = run_spec(tb, RunSpec(mode, **point), 6)
        assert r.step_s >= ideal * (1 - 1e-9), (mode, rg, sp, r.step_s, ideal)


def test_snap_moves_the_split_to_one_the_gangs_divide():
    tb = Testbed.from_dict(_TB)
    assert snap(tb, {"n_rollout": 7, "rollout_gang": 4, "trainer_sp": 1})["n_rollout"] == 8
    assert snap(tb, {"n_rollout": 5, "rollout_gang": 2, "trainer_sp": 4})["n_rollout"] == 4
    assert snap(tb, {"n_rollout": 5})["n_rollout"] == 5


# ----------------------------------------------------------------------------- refusals


def test_refusals_name_the_key():
    flux = load_testbed("h200x16-flux", rollout_gang=2)
    why = refusal(flux)
    assert why and "rollout_gang=2" in why and "no sequence-parallel attention" in why
    with pytest.raises(ValueError, match="rollout_gang"):
        simulate(flux, modes=("digenrl",))
    hv = load_testbed("h200x16-hunyuan", trainer_sp=5)
    why = refusal(hv)
    assert why and "trainer_sp=5" in why and "24 attention heads" in why
    # a Config the runtime would accept but the heads cannot split: the duration function says which key
    cfg = _sp_cfg("model.name=hunyuan-video", "runtime.testbed=h200x16-hunyuan", "runtime.trainer.workers=1",
                  "runtime.trainer.gang=5", "runtime.trainer.sp=5", "runtime.rollout.gang=1",
                  "runtime.rollout.workers=1")
    with pytest.raises(ConfigError, match=r"runtime\.trainer\.sp=5"):
        duration_fn(cfg, load_testbed("h200x16-hunyuan"), cost_model())
    # colocated runs are priced on the baselines' memory plans, which have no sequence parallelism
    with pytest.raises(ConfigError, match=r"runtime\.trainer\.sp: .*disaggregated"):
        duration_fn(_sp_cfg("run.mode=colocated", "runtime.rollout.gang=1", "model.name=hunyuan-video",
                            "runtime.testbed=h200x16-hunyuan"), load_testbed("h200x16-hunyuan"), cost_model())


def test_the_720p_preset_plans_sequence_parallel_rollouts():
    tb = load_testbed("h200x32-hunyuan-720p")
    assert (tb.height, tb.width, tb.frames) == (720, 1280, 53) and refusal(tb) is None
    cfg = config_for(tb, RunSpec("digenrl", n_rollout=12, rollout_gang=4), 2)
    assert cfg.runtime.rollout.workers == 3 and cfg.runtime.rollout.gang == 4


@pytest.mark.parametrize("mode", ["gap", "gap+tsp"])
def test_planner_within_5_percent_of_exhaustive_over_the_degrees(mode):
    from digenrl.sim.planner import exhaustive, grid

    tb = Testbed.from_dict({**_TB, "pools": [dict(name="h", count=8, device="H200", role="any", gpus_per_node=8)],
                            "denoise_steps": 4, "trained_steps": 2, "group_size": 8, "groups_per_step": 1})
    assert grid(tb, mode)["rollout_gang"] == [1, 2, 4, 8] and grid(tb, mode)["trainer_sp"] == [1, 2, 4, 8]
    p, e = plan(tb, mode=mode, steps=4), exhaustive(tb, mode=mode, steps=4)
    assert p.throughput >= 0.95 * e.throughput and p.evaluated < e.evaluated

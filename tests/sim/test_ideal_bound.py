"""No scheduling mode beats the ideal bound: step_s >= ideal_step_s on any testbed.

Utilisation = ideal seconds per step / simulated seconds per step. The ideal bound assumes
every GPU busy on useful work only, so a row above 100% means the simulator lost track of
work somewhere. This file draws 200 random testbeds (split pools and heterogeneous
rollout + trainer pairs) and KNOB_DRAWS random legal knob points for every row of
simulate.ROWS, and checks the bound on each run; then the cases that broke it:
Flow-GRPO's FLUX settings (the steady window borrowing generation done before it), and
two the property found (a growing rollout lead on a heterogeneous testbed; units that cut
prompt groups encoding too few prompts).

Random draws are seeded (reproducible); a failure prints the testbed dict, the row, its
knobs, step_s, the ideal and the utilisation, so `run_spec(Testbed.from_dict(testbed),
spec, steps)` replays it.
"""

from __future__ import annotations

import random
import time

import pytest

from digenrl.sched import BATCH_MODES
from digenrl.sim.catalogue import MODELS, WEIGHT_SYNC_METHODS
from digenrl.sim.costs import CostModel
from digenrl.sim.devices import DEVICES
from digenrl.sim.planner import default_point, grid, snap
from digenrl.sim.report import ideal_step_s, run_spec
from digenrl.sim.workload import RunSpec
from digenrl.sim.simulate import ROWS, homogeneous_reference
from digenrl.sim.testbed import Testbed, TestbedError
from digenrl.sim.workload import fitting_gang, refusal

SEED = 20261130
N_TESTBEDS = 200
STEPS = 6  # window: optimizer ends of steps 2..4 (report.measure); few steps keep 4,800 runs fast
KNOB_DRAWS = 3  # random knob points per (testbed, row)
# fraction of (testbed, row, knobs) draws that must run: no pass on skips. 0.7 since issue 24: a
# shipped peer now refuses the points its own memory layout cannot hold (flow_grpo's ZeRO-2 on 48 GB
# parts), as every row does; 78% of flow_grpo's draws ran on the 200-testbed draw
RAN_AT_LEAST = 0.7
TOL = 1e-9

# The entries these draws were written for (the measured five and HunyuanVideo): a fixed list keeps
# every seed's draws; the entries scaled since issue 28 are checked per family in
# test_catalogue_families.py
DRAWN_MODELS = ("flux.1-12b", "hunyuanvideo-13b", "qwen-image-20b", "sd3.5-medium", "wan2.1-1.3b", "wan2.1-14b")
IMAGE_MODELS = sorted(m for m in DRAWN_MODELS if MODELS[m].kind == "image")
VIDEO_MODELS = sorted(m for m in DRAWN_MODELS if MODELS[m].kind == "video")
# Rollout GPUs of a heterogeneous testbed need to hold the generator (inference only);
# 40 GiB holds the 20B ones in bf16. Smaller cards only pair with small models.
BIG_MEMORY = sorted(d for d, dev in DEVICES.items() if dev.hbm_gib >= 40)
SMALL_MODELS = ("sd3.5-medium", "wan2.1-1.3b")


# ----------------------------------------------------------------------------- random testbeds


def _pool_count(rng: random.Random, lo: int, hi: int, gpn: int) -> int:
    """A GPU count in [lo, hi] that fills whole nodes once it spans more than one (testbed rule)."""
    legal = [c for c in range(lo, hi + 1) if c <= gpn or c % gpn == 0]
    return rng.choice(legal)


def _pools(rng: random.Random, model: str) -> list[dict]:
    """One split pool (role any, 2-16 GPUs) or a rollout + trainer pair on different devices."""
    devices = sorted(DEVICES) if model in SMALL_MODELS else BIG_MEMORY
    gpn = rng.choice((8, 4))
    if rng.random() < 0.6:
        return [{"name": "all", "count": _pool_count(rng, 2, 16, gpn), "device": rng.choice(devices),
                 "role": "any", "gpus_per_node": gpn}]
    rdev, tdev = rng.sample(devices, 2)
    return [{"name": "rollout", "count": _pool_count(rng, 1, 8, gpn), "device": rdev, "role": "rollout",
             "gpus_per_node": gpn},
            {"name": "trainer", "count": _pool_count(rng, 1, 8, gpn), "device": tdev, "role": "trainer",
             "gpus_per_node": gpn}]


def _workload(rng: random.Random, model: str) -> dict:
    """Small RL steps: 2-8 denoising steps, groups of 2-8, 2-8 groups, batches of 1-4."""
    denoise = rng.randint(2, 8)
    cfg = rng.random() < 0.5
    lora = rng.random() < 0.5
    video = MODELS[model].kind == "video"
    return {
        "model": model,
        "height": rng.choice((256, 384, 512)),
        "width": rng.choice((256, 384, 512)),
        "frames": rng.choice((5, 9)) if video else 1,
        "denoise_steps": denoise,
        "trained_steps": rng.randint(1, denoise - 1),  # an SDE window: the last step is always ODE
        "group_size": rng.randint(2, 8),
        "groups_per_step": rng.randint(2, 8),
        "micro_batch": rng.randint(1, 4),
        "rollout_batch": rng.randint(1, 4),
        "cfg": cfg,
        "train_cfg": cfg and rng.random() < 0.5,
        "lora": lora,
        "lora_rank": rng.choice((8, 32, 64)),
        "grad_ckpt": rng.random() < 0.7,
        "kl": rng.random() < 0.3,
        "reward": "videoalign" if video else rng.choice(("pickscore", "hpsv2")),
        "weight_sync": rng.choice([w for w in WEIGHT_SYNC_METHODS if lora or w != "lora-only"]),
    }


def random_testbeds(seed: int, n: int, cm: CostModel) -> tuple[list[dict], int]:
    """`n` testbed dicts the runtime can run, and how many draws were redrawn (invalid or refused)."""
    rng = random.Random(seed)
    out, redrawn = [], 0
    while len(out) < n:
        model = rng.choice(IMAGE_MODELS + VIDEO_MODELS)
        d = {"name": f"prop{len(out)}", "pools": _pools(rng, model), **_workload(rng, model)}
        try:
            tb = Testbed.from_dict(d)
        except TestbedError:
            redrawn += 1
            continue
        if refusal(tb, cm, memory=True):  # e.g. no trainer gang of these GPUs holds a full fine-tune
            redrawn += 1
            continue
        out.append(d)
    return out, redrawn


# ----------------------------------------------------------------------------- random knobs


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def random_spec(rng: random.Random, tb: Testbed, mode: str, style: str | None, cm: CostModel) -> RunSpec:
    """A random point of the planner's grid for `mode` (every knob it uses), plus a gang.

    Batch-level modes may cut groups (samples_per_group 1, micro-batches of samples) or not;
    GAP modes train whole groups. The gang is None (the smallest that fits) or a larger
    divisor of the trainer GPUs (a multiple of trainer_sp); a gang that does not fit is
    refused (a counted skip). Video models draw sequence-parallel degrees too (rollout_gang,
    trainer_sp), the split moved to the nearest one they divide, as the planner does.
    """
    point = snap(tb, {axis: rng.choice(values) for axis, values in grid(tb, mode).items()})
    spg = None
    if mode in BATCH_MODES:
        spg = rng.choice((1, None))
        if spg is None:  # micro-batches of whole groups
            point["micro_batch_groups"] = rng.choice(_divisors(tb.groups_per_step))
    if mode != "colocated" and rng.random() < 0.4:
        if tb.split_pool:
            trainers = tb.n_gpus - point["n_rollout"]
        else:
            trainers = sum(p.count for p in tb.pool("trainer"))
        sp = point.get("trainer_sp") or 1
        smallest = fitting_gang(tb, trainers, cm, after_step=point.get("reshard") == "after-step", sp=sp)
        gangs = [g for g in _divisors(trainers) if g >= max(smallest, 1) and g % sp == 0]
        if gangs:
            point["gang"] = rng.choice(gangs)
    return RunSpec(mode, samples_per_group=spg, style=style, **point)


def _as_dict(where: Testbed, d: dict) -> dict:
    """The dict that rebuilds `where`: `d` itself, or d with the reference's one pool."""
    if where.name == d["name"]:
        return d
    p = where.pools[0]
    return {**d, "name": where.name, "pools": [{"name": p.name, "count": p.count, "device": p.device,
                                                 "role": p.role, "gpus_per_node": p.gpus_per_node}]}


def _failure(d: dict, label: str, spec: RunSpec, step_s: float, ideal: float, steps: int = STEPS) -> str:
    return (f"row {label!r} beats the ideal bound: step_s={step_s!r} < ideal={ideal!r} "
            f"(utilisation {ideal / step_s:.6f})\n  testbed: {d!r}\n  spec: {spec!r}\n  knobs: {spec.knobs()}\n"
            f"  replay: run_spec(Testbed.from_dict(testbed), spec, {steps})")


def check_bound(seed: int, n: int, steps: int = STEPS) -> dict:
    """Run every row KNOB_DRAWS times on `n` random testbeds and assert the bound on each run.

    Returns {"ran": {row: runs}, "skipped": {row: refused draws}, "why": [refusals],
    "redrawn": testbeds redrawn, "worst": highest utilisation seen}.
    """
    cm = CostModel()
    tbs, redrawn = random_testbeds(seed, n, cm)
    rng = random.Random(seed + 1)
    ran, skipped, why, worst = dict.fromkeys(ROWS, 0), dict.fromkeys(ROWS, 0), [], 0.0
    for d in tbs:
        tb = Testbed.from_dict(d)
        # Colocated rows cannot split fixed pools: like simulate(), they run on the same-budget
        # homogeneous reference (tb itself when its pool is split) against that cluster's bound.
        ref = homogeneous_reference(tb)
        ideal = {tb.name: ideal_step_s(tb, cm)["step_s"], ref.name: ideal_step_s(ref, cm)["step_s"]}
        for label, (mode, style) in [row for row in ROWS.items() for _ in range(KNOB_DRAWS)]:
            where = ref if mode == "colocated" else tb
            spec = random_spec(rng, where, mode, style, cm)
            try:
                r = run_spec(where, spec, steps, cm)
            except ValueError as e:  # the runtime refuses these knobs here (a gang too small, ...)
                skipped[label] += 1
                why.append(f"{label}: {str(e)[:120]}")
                continue
            ran[label] += 1
            bound = ideal[where.name]
            worst = max(worst, bound / r.step_s)
            assert r.step_s >= bound * (1 - TOL), _failure(_as_dict(where, d), label, spec, r.step_s, bound, steps)
    return {"ran": ran, "skipped": skipped, "why": why, "redrawn": redrawn, "worst": worst}


def _assert_enough_ran(c: dict) -> None:
    """Every row ran on at least RAN_AT_LEAST of its draws: the bound was checked, not skipped."""
    for label in ROWS:
        draws = c["ran"][label] + c["skipped"][label]
        assert c["ran"][label] >= RAN_AT_LEAST * draws, (
            f"row {label!r} ran {c['ran'][label]} of {draws} draws; skips per row {c['skipped']}; "
            f"first refusals: {c['why'][:5]}")


@pytest.mark.slow  # ~23 s of random testbeds (default run under 15 min)
def test_no_row_exceeds_the_ideal_bound_on_random_testbeds():
    t = time.perf_counter()
    c = check_bound(SEED, N_TESTBEDS)
    _assert_enough_ran(c)
    print(f"\n{sum(c['ran'].values())} runs, skips {c['skipped']}, {c['redrawn']} testbeds redrawn, "
          f"worst utilisation {c['worst']:.6f}, {time.perf_counter() - t:.1f} s")


@pytest.mark.slow
def test_no_row_exceeds_the_ideal_bound_longer_runs():
    """Same property with the planner's 12 steps (a window of 6) on another 200 testbeds."""
    _assert_enough_ran(check_bound(SEED + 7, N_TESTBEDS, steps=12))


# ----------------------------------------------------------------------------- the FLUX regression

# Flow-GRPO's FLUX recipe on 16x H200 (2 nodes, one split pool), LoRA rank 32.
FLOW_GRPO_FLUX = {
    "name": "flow-grpo-flux",
    "pools": [{"name": "h200", "count": 16, "device": "H200", "role": "any", "gpus_per_node": 8}],
    "model": "flux.1-12b", "height": 512, "width": 512, "denoise_steps": 6, "trained_steps": 5,
    "group_size": 24, "groups_per_step": 48, "lora": True, "lora_rank": 32, "micro_batch": 3,
    "rollout_batch": 3, "reward": "pickscore", "weight_sync": "lora-only",
}
FLUX_DIGENRL = RunSpec(mode="digenrl", n_rollout=4, micro_batch_groups=1, tsp_chunk=1, tag_segment=6,
                       gen_shard=1, train_shard=4, gang=1)


@pytest.fixture(scope="module")
def flux():
    cm = CostModel()
    tb = Testbed.from_dict(FLOW_GRPO_FLUX)
    return tb, cm, run_spec(tb, FLUX_DIGENRL, 12, cm)


def test_flow_grpo_flux_digenrl_within_the_ideal_bound(flux):
    # Before report.measure charged the window the work of its steps, TCSS entered the
    # window with generation for its steps already done: utilisation read 1.008.
    tb, cm, r = flux
    ideal = ideal_step_s(tb, cm)["step_s"]
    assert ideal / r.step_s <= 1.0, _failure(FLOW_GRPO_FLUX, "digenrl", FLUX_DIGENRL, r.step_s, ideal)


@pytest.mark.parametrize("label", ["colocated-ideal", "verl-omni", "flow_grpo", "one-step-off"])
def test_flow_grpo_flux_generation_matches_the_baselines(flux, label):
    # Every row generates the same samples with the same forwards (rollout_batch 3), so the
    # generate column (GPU-seconds per step / GPUs) must agree; the window error showed as
    # generation 2.1 s/step lower in the digenrl row.
    tb, cm, r = flux
    mode, style = ROWS[label]
    point = default_point(tb, mode, grid(tb, mode), cm)
    base = run_spec(tb, RunSpec(mode, samples_per_group=1 if mode in BATCH_MODES else None, style=style,
                                **point), 12, cm)
    assert r.breakdown_s["generate"] == pytest.approx(base.breakdown_s["generate"], rel=0.01), (
        r.breakdown_s, base.breakdown_s, point)


# ----------------------------------------------------------------------------- cases the property found

# 1 A10G rollout + 1 H20 trainer: the trainer bounds the step (20.91 s of training) while the
# rollout GPU grows its generation lead inside the 6-step window. Spreading that negative
# lead over both GPUs read 102.8% of the ideal; report.measure now spreads it per device type.
HETERO_LEAD = {
    "name": "hetero-lead",
    "pools": [{"name": "rollout", "count": 1, "device": "A10G", "role": "rollout", "gpus_per_node": 8},
              {"name": "trainer", "count": 1, "device": "H20", "role": "trainer", "gpus_per_node": 8}],
    "model": "sd3.5-medium", "height": 512, "width": 512, "denoise_steps": 6, "trained_steps": 1,
    "group_size": 2, "groups_per_step": 7, "micro_batch": 1, "rollout_batch": 2, "cfg": True,
    "train_cfg": True, "lora": True, "lora_rank": 8, "grad_ckpt": True, "reward": "pickscore",
    "weight_sync": "lora-only",
}
HETERO_LEAD_SPEC = RunSpec(mode="digenrl", micro_batch_groups=1, tsp_chunk=1, tag_segment=1, gen_shard=2,
                           train_shard=2, reshard="after-step")


def _within_bound(d: dict, label: str, spec: RunSpec):
    """Run one regression case for STEPS steps; assert it stays within the ideal bound."""
    cm = CostModel()
    tb = Testbed.from_dict(d)
    ideal = ideal_step_s(tb, cm)["step_s"]
    r = run_spec(tb, spec, STEPS, cm)
    assert r.step_s >= ideal * (1 - TOL), _failure(d, label, spec, r.step_s, ideal)
    return tb, cm, r


def test_growing_rollout_lead_does_not_shorten_a_trainer_bound_step():
    tb, cm, r = _within_bound(HETERO_LEAD, "digenrl", HETERO_LEAD_SPEC)
    # in a true steady state (12 steps) the window's wall time is the step: unchanged by the rule
    long = run_spec(tb, HETERO_LEAD_SPEC, 12, cm)
    assert r.step_s == pytest.approx(long.step_s, rel=1e-9)


# 2 H20, colocated GenRL with micro-batches of 3 samples cut from prompt groups of 2: each
# unit encoded 3 // 2 = 1 prompt though it touches 2 (4 encodings for 6 prompts), which read
# 100.7% of the ideal; durations now counts the prompt groups a whole unit touches.
CUT_GROUPS = {
    "name": "cut-groups",
    "pools": [{"name": "all", "count": 2, "device": "H20", "role": "any", "gpus_per_node": 4}],
    "model": "wan2.1-1.3b", "height": 256, "width": 512, "frames": 5, "denoise_steps": 2, "trained_steps": 1,
    "group_size": 2, "groups_per_step": 6, "micro_batch": 2, "rollout_batch": 3, "lora": True,
    "grad_ckpt": False, "reward": "videoalign", "weight_sync": "nccl",
}
CUT_GROUPS_SPEC = RunSpec(mode="colocated", micro_batch_groups=3, samples_per_group=1, tsp_chunk=1, style="genrl")


def test_units_that_cut_prompt_groups_encode_every_prompt_they_touch():
    tb, cm, r = _within_bound(CUT_GROUPS, "genrl", CUT_GROUPS_SPEC)
    # by hand: 4 units of samples [0,3) [3,6) [6,9) [9,12) touch prompts {0,1} {1,2} {3,4} {4,5}:
    # one encoder pass of 2 prompts each (was: of 1), plus 2 denoising steps of one forward of 3;
    # 4 units over 2 GPUs
    enc = float(cm.text_encode_s(tb.model, "H20", 2))
    gen = float(cm.denoise_s(tb.model, "H20", 3, False, tb.shape))
    assert r.breakdown_s["generate"] == pytest.approx((4 * enc + 4 * 2 * gen) / 2, rel=1e-9)


# A testbed's objective flags (old_forward: DiffusionNFT's kept old policy; pair_rows: Diffusion-DPO's
# pairs) were priced by the ideal bound but not carried into the Config a plan writes, so every row
# ran grpo: issue 28's Cosmos-Predict2.5 NFT testbed read 118% of the ideal. workload.config_for now
# writes the objective, and testbed_for reads the same flags back.
OBJECTIVE = {
    "name": "objective", "pools": [{"name": "all", "count": 4, "device": "H100", "role": "any", "gpus_per_node": 4}],
    "model": "sd3.5-medium", "height": 512, "width": 512, "denoise_steps": 6, "trained_steps": 5, "group_size": 4,
    "groups_per_step": 4, "micro_batch": 1, "rollout_batch": 4, "lora": True, "kl": True, "reward": "pickscore",
    "weight_sync": "lora-only",
}


@pytest.mark.parametrize("flags,loss", [({"old_forward": True}, "nft"), ({"pair_rows": 2}, "dpo"),
                                        ({"pair_rows": 12}, "dpo"), ({}, "grpo")])
def test_objective_flags_reach_the_plan_and_stay_within_the_bound(flags, loss):
    from digenrl.sim.workload import config_for, testbed_for

    d = {**OBJECTIVE, **flags}
    tb = Testbed.from_dict(d)
    cfg = config_for(tb, RunSpec("digenrl", n_rollout=0), 2)
    assert cfg.train.loss == loss
    back = testbed_for(cfg, tb)
    assert (back.old_forward, back.pair_rows, back.kl) == (tb.old_forward, tb.pair_rows, tb.kl)
    for label, spec in (("digenrl", RunSpec("digenrl", n_rollout=0, micro_batch_groups=1, tsp_chunk=1)),
                        ("disagg-sync", RunSpec("disagg-sync", n_rollout=2, micro_batch_groups=1)),
                        ("colocated", RunSpec("colocated", micro_batch_groups=1))):
        _within_bound(d, label, spec)


def test_objective_flags_that_no_config_expresses_are_refused():
    from digenrl.config.errors import ConfigError
    from digenrl.sim.workload import config_for

    with pytest.raises(ConfigError, match="pair_rows 5"):
        config_for(Testbed.from_dict({**OBJECTIVE, "pair_rows": 5}), RunSpec("digenrl", n_rollout=0), 2)
    with pytest.raises(ConfigError, match="pick one"):
        config_for(Testbed.from_dict({**OBJECTIVE, "pair_rows": 2, "old_forward": True}), RunSpec("digenrl", n_rollout=0), 2)
    with pytest.raises(TestbedError, match="needs kl: true"):
        Testbed.from_dict({**OBJECTIVE, "pair_rows": 2, "kl": False})

"""Distributed modes vs the single-device trainer, same seed.

On-policy modes train on the same trajectories with the same advantages, so they must end
with the same weights as `Trainer` (tests/helpers/equivalence.py says how close, and why).
Off-policy modes (one-step-off, digenrl) must train every trajectory with one version and
a lag of at most one.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.io.outputs import REQUIRED_KEYS, read_metrics
from digenrl.io.recorder import SUMMARY_KEYS
from digenrl.runtime.driver import RayDriver
from digenrl.sim.gangs import predict_comm
from digenrl.sim.tag_switch import SwitchLedger
from digenrl.train.trainer import Trainer

from tests.helpers.equivalence import assert_matches_single_device, final_weights
from tests.helpers.exactly_once import assert_trained_exactly_once

from .conftest import tiny

RUNTIME_KEYS = ("mode", "staleness_max", "bubble_ratio_rollout", "bubble_ratio_trainer",
                "weight_sync_s", "weight_sync_bytes")


ON_POLICY = {
    # mode: extra overrides (pool sizes chosen to cover the all-reduce, TSP and TAG paths)
    "colocated": [],  # 2 colocated workers (rollout + trainer devices): all-reduce
    "disagg-sync": [],
    "gap": [],
    "gap+tsp": ["runtime.trainer.workers=2", "train.tsp_chunk=1"],
    "gap+tsp+tag": ["runtime.trainer.workers=2", "train.tsp_chunk=1"],
    # micro-batches of 3 samples cut the 2-sample prompt groups (advantages over the whole
    # step); an explicit TSP chunk splits the batch-level training evenly over 2 trainers
    "disagg-sync cut groups": ["data.micro_batch_samples=3", "runtime.trainer.workers=2", "train.tsp_chunk=1"],
}


# The default tier runs gap+tsp+tag (TSP and TAG over two trainers, the all-reduce); the other
# modes run in the slow tier, which CI runs too.
DEFAULT_TIER = {"gap+tsp+tag"}


@pytest.mark.parametrize("mode", [m if m in DEFAULT_TIER else pytest.param(m, marks=pytest.mark.slow)
                                  for m in ON_POLICY])
def test_on_policy_modes_match_single_device(ray_cluster, local_run, tmp_path, mode):
    run = tmp_path / mode.replace(" ", "_")
    cfg = load_config(None, tiny(run, mode.split(" ")[0], *ON_POLICY[mode]))
    rt = RayDriver(cfg, progress=False)
    summary = rt.train()
    assert_matches_single_device(run, local_run)
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    ref = [r for r in read_metrics(local_run) if r["step"] > 0]
    assert [r["step"] for r in ours] == [1, 2]
    for a, b in zip(ours, ref):  # same trajectories -> same rewards; on-policy -> ratio 1
        assert set(REQUIRED_KEYS) <= set(a) and set(RUNTIME_KEYS) <= set(a)
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["staleness_max"] == 0 and a["mode"] == mode.split(" ")[0]
        assert 0.0 <= a["bubble_ratio_rollout"] <= 1.0 and 0.0 <= a["bubble_ratio_trainer"] <= 1.0
    assert ours[0]["ratio_mean"] == 1.0  # the first update sees ratio == 1 exactly
    # one summary for both trainers: the local keys plus the Ray run's schedule, the same base model
    assert json.loads((run / "summary.json").read_text()) == summary
    assert set(summary) >= set(SUMMARY_KEYS) and {"scheduler", "trace", "gantt"} <= set(summary)
    local = json.loads((local_run / "summary.json").read_text())
    assert summary["eval_reward_before"] == pytest.approx(local["eval_reward_before"], abs=1e-6)
    assert summary["eval_reward_after"] == pytest.approx(local["eval_reward_after"], abs=1e-4)
    assert (run / "trace.json").exists() and (run / "gantt.png").exists()
    if mode == "gap+tsp+tag":  # idle trainers generated with their own weights
        on_trainers = sum(s.kind == "generate" and rt.trace.workers[s.worker] == "trainer" for s in rt.trace.spans)
        assert on_trainers > 0
        # one counted round trip per run of consecutive Generates on a trainer, as the simulator
        # charges them (sim/tag_switch.SwitchLedger over this run's own trace)
        assert sum(r["tag/switches"] for r in ours) == SwitchLedger.of_trace(rt.trace).switches > 0
        assert all(r["tag/offload_bytes"] == 0 for r in ours)  # tag_offload=auto on a CPU: never
    if mode != "colocated":
        assert all(r["weight_sync_bytes"] > 0 for r in ours[1:])  # rollout pulled version 1
        # unsharded trainers count their gradient all-reduce as the simulator charges it
        for rec, pred in zip(ours, predict_comm(cfg, rt.trace)):
            for k, v in pred.items():
                assert rec.get(k, 0) == v, (rec["step"], k)
        assert (ours[0].get("comm/train/all_reduce_bytes", 0) > 0) == (cfg.runtime.trainer.workers > 1)


@pytest.mark.slow  # a Ray run; the switch's restore is tested bit for bit in tests/runtime/test_tag_switch.py
def test_tag_offload_always_matches_single_device(ray_cluster, local_run, tmp_path):
    """gap+tsp+tag with no rollout pool (every Generate on a trainer) and tag_offload=always:
    each Generate is a counted switch, those over accumulated gradients offload and restore,
    and the run still ends at the single-device weights."""
    run = tmp_path / "tag-offload"
    cfg = load_config(None, tiny(run, "gap+tsp+tag", "runtime.rollout.workers=0", "runtime.trainer.workers=2",
                                 "train.tsp_chunk=1", "runtime.trainer.tag_offload=always"))
    rt = RayDriver(cfg, progress=False)
    rt.train()
    assert_matches_single_device(run, local_run)
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    generates = sum(s.kind == "generate" for s in rt.trace.spans)
    ledger = SwitchLedger.of_trace(rt.trace, moved=1)  # moved: an offload wherever a gradient was held
    assert generates > 0 and sum(r["tag/switches"] for r in ours) == ledger.switches > 0
    assert sum(r["tag/offloads"] for r in ours) == ledger.offloads
    for r in ours:
        assert r["tag/offload_bytes"] >= 0 and r["tag/switch_s"] >= 0
        print("tag", r["step"], {k: v for k, v in r.items() if k.startswith("tag/")})


@pytest.mark.slow  # the default tier resumes in tests/test_trainer.py (local) and test_faults (Ray)
def test_resume_continues_exactly(ray_cluster, local_run, tmp_path):
    """2 Ray steps (checkpoint) + --resume to 3 == 3 single-device steps."""
    ref = tmp_path / "local3"
    Trainer(load_config(None, tiny(ref, "local", steps=3)), progress=False).train()
    run = tmp_path / "ray"
    RayDriver(load_config(None, tiny(run, "gap", "run.checkpoint_every=1")), progress=False,
               evaluate=False).train()
    RayDriver(load_config(None, tiny(run, "gap", steps=3)), progress=False, evaluate=False).train(resume=True)
    assert_matches_single_device(run, ref)
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


@pytest.mark.slow  # TCSS is opt-in (run.tcss_fraction): the default tier runs on policy
@pytest.mark.parametrize("mode", ["one-step-off", "digenrl"])
def test_off_policy_lag_at_most_one(ray_cluster, tmp_path, mode):
    run = tmp_path / mode
    tcss = ["run.tcss_fraction=1"] if mode == "digenrl" else []  # TCSS, opt-in
    cfg = load_config(None, tiny(run, mode, "model.lora_rank=4", "runtime.weight_sync=lora-only", *tcss, steps=3))
    rt = RayDriver(cfg, progress=False, evaluate=False)
    rt.train()
    records = read_metrics(run)
    assert [r["staleness_max"] for r in records][0] == 0
    assert max(r["staleness_max"] for r in records) == 1  # it did overlap, and lag <= 1
    # Every trajectory was generated by exactly one version; Train units agree with it.
    gen, trained = {}, {}
    for s in rt.trace.spans:
        if s.kind == "generate":
            gen.setdefault((s.unit.step, s.unit.mb), set()).add(s.unit.version)
        if s.kind == "train":
            trained.setdefault((s.unit.step, s.unit.mb), set()).add(s.unit.traj_version)
            assert 0 <= s.unit.step - s.unit.traj_version <= 1
    assert gen and all(len(v) == 1 for v in gen.values())
    assert trained == gen
    # lora-only sync moves adapters only
    adapters = load_file(str(run / "final" / "policy.safetensors"))
    assert all("lora_" in k for k in adapters)
    per_pull = sum(v.numel() * v.element_size() for v in adapters.values())
    assert any(r["weight_sync_bytes"] for r in records)
    assert all(r["weight_sync_bytes"] % per_pull == 0 for r in records)
    trace = json.loads((run / "trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {"generate", "reward", "train",
                                                                          "optimizer", "sync"}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [m for m in ON_POLICY if " " not in m])
def test_sample_shards_match_single_device(ray_cluster, local_run, tmp_path, mode):
    """GAP along the generation axis, in every on-policy mode: micro-batches of 2 groups (4
    samples) generated as 3 fragments (rows 0-1, 2, 3) on 2 rollout workers (colocated: 2
    colocated workers), each fragment scored on its own as it finishes, the groups assembled
    once all three are scored; Train units cut in 2 sample shards (0-1, 2-3, straddling the
    fragments) where the mode spreads training. Per-sample randomness makes the fragments
    reproduce the unsharded trajectories, so the rewards and the weights match."""
    run = tmp_path / mode
    pools = [] if mode == "colocated" else ["runtime.rollout.workers=2"]
    spread = ["runtime.trainer.workers=2", "train.tsp_chunk=1", "runtime.train_shard=2"] if "tsp" in mode else []
    rt = RayDriver(load_config(None, tiny(run, mode, "data.micro_batch_groups=2", *pools, *spread,
                                           "runtime.gen_shard=3")),
                    progress=False, evaluate=False)
    rt.train()
    assert_matches_single_device(run, local_run)
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    ref = [r for r in read_metrics(local_run) if r["step"] > 0]
    for a, b in zip(ours, ref):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
    gens = [s.unit for s in rt.trace.spans if s.kind == "generate"]
    trains = [s.unit for s in rt.trace.spans if s.kind == "train"]
    rewards = [s.unit for s in rt.trace.spans if s.kind == "reward"]
    assert {u.samples for u in gens} == {(0, 2), (2, 3), (3, 4)}
    assert sorted(u.samples for u in rewards) == sorted(u.samples for u in gens if u.t_end == 4)  # one per fragment
    assert {u.samples for u in trains} == ({(0, 2), (2, 4)} if "tsp" in mode else {None})
    assert_trained_exactly_once(rt.trained, rt.cfg, 2)


def test_generate_shards_concatenate_to_the_micro_batch(tmp_path):
    """Per-sample randomness: shards of rows [0,1), [1,3), [3,4) concatenate to exactly the
    unsharded micro-batch; select_rows cuts it back (no Ray needed)."""
    from digenrl.data import PromptSource, load_prompts
    from digenrl.models import build_policy
    from digenrl.rollout import generate
    from digenrl.runtime.shards import concat_trajectories, select_rows
    from digenrl.train.trainer import plan_step

    cfg = load_config(None, tiny(tmp_path, "gap", "data.micro_batch_groups=2"))
    policy = build_policy(cfg.model, progress=False)
    plan = plan_step(cfg, PromptSource(load_prompts(cfg.data.prompts), 0, cfg.data.groups_per_step), 0)
    mb = plan.micro_batches[0]
    whole = generate(policy, mb.prompts, mb.coords, plan.spec, step=0, version=0)
    shards = [generate(policy, mb.prompts[a:b], mb.coords[a:b], plan.spec, step=0, version=0)
              for a, b in ((0, 1), (1, 3), (3, 4))]
    cat = concat_trajectories(shards)
    assert cat.coords == whole.coords and cat.prompts == whole.prompts
    # batch-size dependent kernels: float rounding only, which the ODE steps carry forward:
    # up to 3.8e-5 on latents of magnitude up to 4.4 with the 2026-12-01 base (6.7e-5 with
    # the all-but-last window); the earlier base stayed under 1e-5
    for name in ("latents", "images"):
        assert torch.allclose(getattr(cat, name), getattr(whole, name), atol=1e-4)
    assert torch.equal(cat.log_probs.isnan(), whole.log_probs.isnan())
    assert torch.allclose(cat.log_probs.nan_to_num(), whole.log_probs.nan_to_num(), atol=1e-5)
    part = select_rows(cat, 1, 3)
    assert part.coords == whole.coords[1:3] and torch.equal(part.latents, cat.latents[1:3])
    assert all(torch.equal(part.cond[k], cat.cond[k][1:3]) for k in cat.cond)


@pytest.mark.slow
def test_grpo_guard_gap_tsp_matches_single_device(ray_cluster, local_run, tmp_path):
    """train.loss=grpo-guard: gap+tsp (one trained step per Train unit, 2 trainers) ends with
    the weights of the single-device run with the same loss, and not with grpo's."""
    guard = ["train.loss=grpo-guard"]
    ref = tmp_path / "local_guard"
    Trainer(load_config(None, tiny(ref, "local", *guard)), progress=False).train()
    run = tmp_path / "gap_tsp_guard"
    RayDriver(load_config(None, tiny(run, "gap+tsp", *ON_POLICY["gap+tsp"], *guard)), progress=False).train()
    assert_matches_single_device(run, ref)
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    theirs = [r for r in read_metrics(ref) if r["step"] > 0]
    for a, b in zip(ours, theirs):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["loss/guard_bias"] < 1e-9  # on-policy: the rebuilt behaviour mean is the live one
    assert ours[0]["ratio_mean"] == 1.0
    a, b = final_weights(ref), final_weights(local_run)
    assert any(not torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-5) for k in a), "grpo-guard trained like grpo"


@pytest.mark.parametrize("mode,extra", [
    # DiffusionNFT on ODE rollouts, every sample its own noise levels; trainers generate too (TAG)
    ("gap+tsp+tag", ["train.loss=nft", "sampling.sde=ode", "sampling.window=all-but-last", "sampling.window_draw=sample"]),
    # DanceGRPO's per-sample fraction window
    ("gap+tsp", ["sampling.sde=dance-sde", "sampling.window=fraction", "sampling.window_draw=sample"]),
])
@pytest.mark.slow
def test_per_sample_trained_steps_match_single_device(ray_cluster, tmp_path, mode, extra):
    """Train units name slots; each row maps them to its own steps (or NFT noise levels).
    Spread over 2 trainers one slot per unit, the run ends at the single-device weights."""
    ref = tmp_path / "local"
    Trainer(load_config(None, tiny(ref, "local", *extra)), progress=False).train()
    run = tmp_path / "ray"
    RayDriver(load_config(None, tiny(run, mode, *ON_POLICY[mode], *extra)), progress=False).train()
    assert_matches_single_device(run, ref)
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    theirs = [r for r in read_metrics(ref) if r["step"] > 0]
    for a, b in zip(ours, theirs):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        for k in ("loss/policy", "train/grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-4), k


NFT = ["train.loss=nft", "sampling.sde=ode", "sampling.window_draw=sample"]
# online Diffusion-DPO (best-worst pairs of each group) on ODE rollouts, LoRA (reference: the
# adapters off) and full fine-tune (a frozen copy); Flow-DPPO on flow-sde
OBJECTIVES = {"nft": NFT, "grpo-guard": ["train.loss=grpo-guard"], "dpo": ["train.loss=dpo", "sampling.sde=ode"],
              "dpo full": ["train.loss=dpo", "sampling.sde=ode", "model.lora_rank=0", "train.lr=1e-4"],
              "flow-dppo": ["train.loss=flow-dppo"]}
# AWM (issue 27): ODE rollouts, each sample its own two noise levels, KL to the base model on
OBJECTIVES["awm"] = ["train.loss=awm", "sampling.sde=ode", "sampling.window_draw=sample", "train.beta=0.01"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(ON_POLICY))
@pytest.mark.parametrize("loss", list(OBJECTIVES))
def test_every_on_policy_mode_runs_each_objective_as_one_device(ray_cluster, tmp_path, mode, loss):
    """Slow tier (`pytest -m slow tests/runtime/test_equivalence.py`): the matrix of objectives
    x on-policy modes; the default tier runs one mode of each. dpo pairs samples within a
    prompt group, so the mode that cuts groups (data.micro_batch_samples) is refused, named."""
    extra = OBJECTIVES[loss]
    if loss.startswith("dpo") and "data.micro_batch_samples=3" in ON_POLICY[mode]:
        with pytest.raises(ConfigError, match="data.micro_batch_samples"):
            load_config(None, tiny(tmp_path, mode.split(" ")[0], *ON_POLICY[mode], *extra))
        return
    ref = tmp_path / "local"
    Trainer(load_config(None, tiny(ref, "local", *extra)), progress=False).train()
    run = tmp_path / "ray"
    RayDriver(load_config(None, tiny(run, mode.split(" ")[0], *ON_POLICY[mode], *extra)), progress=False).train()
    assert_matches_single_device(run, ref)


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["nft", "awm", "dpo", "flow-dppo"])
def test_off_policy_trains_each_trajectory_at_lag_at_most_one(ray_cluster, tmp_path, loss):
    run = tmp_path / "digenrl"
    rt = RayDriver(load_config(None, tiny(run, "digenrl", "run.tcss_fraction=1", *OBJECTIVES[loss], steps=4)), progress=False,
                   evaluate=False)
    rt.train()
    assert max(r["staleness_max"] for r in read_metrics(run)) <= 1
    assert all(0 <= s.unit.step - s.unit.traj_version <= 1 for s in rt.trace.spans if s.kind == "train")


# A bf16 rollout against fp32 trainers, the behaviour log-prob recomputed, and a truncation
# band so narrow (the tiny DiT's bf16 gap is ~1e-5 per step-averaged log-prob) that it acts.
CONSISTENCY = ["sampling.rollout_dtype=bfloat16", "train.behaviour_logp=recompute",
               "train.is_correction=truncated", "train.is_band=1.000005"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gap+tsp", "digenrl"])
def test_consistency_keys_act_on_ray_as_on_one_device(ray_cluster, tmp_path, mode):
    """sampling.rollout_dtype, train.behaviour_logp, train.is_correction and train.is_band on Ray:
    on-policy (gap+tsp, 2 trainers) the run ends at the single-device weights and reports the
    same gap; under digenrl (lag <= 1) every step reports a gap."""
    run = tmp_path / mode
    tcss = ["run.tcss_fraction=1"] if mode == "digenrl" else []  # lag <= 1: TCSS, opt-in
    RayDriver(load_config(None, tiny(run, mode, *ON_POLICY.get(mode, []), *CONSISTENCY, *tcss)), progress=False,
              evaluate=False).train()
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    assert all(r["consistency/gap_abs_max"] > 0 and r["loss/clipfrac"] == 0.0 for r in ours)
    assert all(r["consistency/is_weight_max"] <= 1.000005 + 1e-7 for r in ours)
    if mode == "digenrl":
        assert max(r["staleness_max"] for r in ours) <= 1
        return
    ref = tmp_path / "local"
    Trainer(load_config(None, tiny(ref, "local", *CONSISTENCY)), progress=False).train()
    assert_matches_single_device(run, ref)
    theirs = [r for r in read_metrics(ref) if r["step"] > 0]
    for a, b in zip(ours, theirs):
        assert a["consistency/gap_abs_max"] == pytest.approx(b["consistency/gap_abs_max"], rel=1e-3)
        assert a["consistency/gap_abs_mean"] == pytest.approx(b["consistency/gap_abs_mean"], rel=1e-3)
        assert a["consistency/is_weight_mean"] == pytest.approx(b["consistency/is_weight_mean"], rel=1e-6)


# DiffusionNFT with its old policy kept (train.nft_decay): d = 0.5 from version 1, so step 2's
# rollouts come from an old policy that differs from the trained one, and beta 0.5 acts
NFT_DECAY = [*NFT, "train.nft_decay=0.5", "train.nft_decay_rate=0.5", "train.nft_beta=0.5"]


@pytest.mark.slow  # ~55 s a mode on 2 busy cores; the default tier checks it locally (tests/test_trainer.py)
@pytest.mark.parametrize("mode", list(ON_POLICY))
def test_nft_old_policy_matches_single_device(ray_cluster, tmp_path, mode):
    """The old policy lives on the trainers: TAG generation samples with it, rollout workers
    receive it instead of the trained weights, and v_old is its forward; every on-policy mode
    ends at the single-device weights."""
    ref = tmp_path / "local"
    Trainer(load_config(None, tiny(ref, "local", *NFT_DECAY)), progress=False).train()
    run = tmp_path / "ray"
    rt = RayDriver(load_config(None, tiny(run, mode.split(" ")[0], *ON_POLICY[mode], *NFT_DECAY)), progress=False)
    rt.train()
    assert_matches_single_device(run, ref)
    ours = [r for r in read_metrics(run) if r["step"] > 0]
    theirs = [r for r in read_metrics(ref) if r["step"] > 0]
    assert [r["train/nft_old_decay"] for r in ours] == [0.5, 0.5]
    for a, b in zip(ours, theirs):  # step 2 sampled by the old policy on both sides
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], abs=1e-6)
        assert a["loss/nft_old_deviation"] == pytest.approx(b["loss/nft_old_deviation"], rel=1e-4)
    assert ours[0]["loss/nft_old_deviation"] == 0.0 and ours[1]["loss/nft_old_deviation"] > 0
    if mode == "gap+tsp+tag":
        assert any(s.kind == "generate" and rt.trace.workers[s.worker] == "trainer" for s in rt.trace.spans)
        assert any(s.kind == "generate" and rt.trace.workers[s.worker] == "rollout" and s.unit.step == 1
                   for s in rt.trace.spans)


@pytest.mark.slow
def test_nft_old_policy_off_policy_lag_at_most_one_and_resume(ray_cluster, tmp_path):
    """run.mode=digenrl with the old policy kept: lag <= 1; and a Ray run resumed from its
    checkpoint (old policy read back on every trainer) ends where the uninterrupted one does."""
    run = tmp_path / "digenrl"
    rt = RayDriver(load_config(None, tiny(run, "digenrl", "run.tcss_fraction=1", *NFT_DECAY, steps=4)), progress=False, evaluate=False)
    rt.train()
    assert max(r["staleness_max"] for r in read_metrics(run)) <= 1
    assert all(0 <= s.unit.step - s.unit.traj_version <= 1 for s in rt.trace.spans if s.kind == "train")
    ref = tmp_path / "local3"
    Trainer(load_config(None, tiny(ref, "local", *NFT_DECAY, steps=3)), progress=False).train()
    part = tmp_path / "gap"
    over = [*ON_POLICY["gap+tsp+tag"], *NFT_DECAY]
    RayDriver(load_config(None, tiny(part, "gap+tsp+tag", *over, "run.checkpoint_every=1")), progress=False,
              evaluate=False).train()
    RayDriver(load_config(None, tiny(part, "gap+tsp+tag", *over, steps=3)), progress=False,
              evaluate=False).train(resume=True)
    assert_matches_single_device(part, ref)

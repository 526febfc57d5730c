"""Sequence-parallel gangs on the Ray runtime (issue #12), tiny Wan on CPU (gloo).

A rollout gang of 2 (runtime.rollout.gang=2) generates every trajectory across its two
ranks; a trainer gang of 2 with sp=2 (FSDP over the gang, both ranks on the same rows, each
on half of the video tokens) trains. gap+tsp is on-policy, so the run must end at the
single-device run's weights up to float round-off, with the same rewards; the bytes the ranks
counted (all-to-alls for generation and training, FSDP) must be the simulator's prediction.
"""

from __future__ import annotations

import pytest

from digenrl.config.schema import load_config
from digenrl.models import build_policy
from digenrl.models.lora import trainable_state_dict
from digenrl.io.outputs import read_metrics
from digenrl.runtime.driver import RayDriver
from digenrl.sim.gangs import module_layout, predict_comm
from digenrl.sim.sp import SpDims
from digenrl.train.trainer import Trainer

from tests.helpers.equivalence import assert_matches_single_device
from tests.helpers.exactly_once import assert_trained_exactly_once

from .conftest import tiny

pytest.importorskip("diffusers")

# 9 video tokens (3 latent frames x 3 x 1 patches): no degree divides them
WAN = ["model.name=wan", "model.height=48", "model.width=16", "model.frames=9", "model.lora_rank=4",
       "model.lora_alpha=8", "reward.weights={jpeg-compressibility: 1.0}", "train.lr=1e-3",
       "sampling.num_steps=3", "sampling.eval_num_steps=3", "data.groups_per_step=2"]
SP = ["runtime.rollout.gang=2", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp", "runtime.trainer.sp=2",
      "runtime.trainer.num_cpus=0.5", "runtime.rollout.num_cpus=0.5", "run.checkpoint_every=0"]


@pytest.fixture(scope="module")
def wan(tmp_path_factory) -> str:
    from tests.models.tiny_diffusers import build_wan

    return str(build_wan(tmp_path_factory.mktemp("wan"), heads=4))


def _overrides(run, mode, wan, *extra):
    return tiny(run, mode, *WAN, f"model.path={wan}", *extra)


# +tag: the trainer gang generates too; nccl: rank 0 of the rollout gang receives each version
# from the relay and broadcasts it to rank 1 (a stale rank 1 would change step 2's samples)
CASES = {"gap+tsp": [], "gap+tsp+tag": [], "gap+tsp nccl": ["runtime.weight_sync=nccl"]}
# the slow tier (-m slow, which CI runs): the default tier checks sequence parallelism in one
# process (tests/models/test_sequence_parallel.py) and Ray gangs through the trainer's FSDP gang
# (tests/runtime/test_gangs.py)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sequence_parallel_gangs_match_single_device(ray_cluster, tmp_path, wan, case):
    mode = case.split()[0]
    local = tmp_path / "local"
    Trainer(load_config(None, _overrides(local, "local", wan)), progress=False).train()
    run = tmp_path / "sp"
    rt = RayDriver(load_config(None, _overrides(run, mode, wan, "train.tsp_chunk=1", *SP, *CASES[case])),
                    progress=False, evaluate=False)
    rt.train()

    assert_matches_single_device(run, local)

    records = [r for r in read_metrics(run) if r["step"] > 0]
    ref = [r for r in read_metrics(local) if r["step"] > 0]
    assert len(records) == len(ref) == 2
    for r, l in zip(records, ref):  # the same trajectories (rewards), trained by the same gradients
        # JPEG size is a step function of the pixels: the attention's round-off (1e-6) can move
        # one frame's file by a byte, 1/1024 kB over 9 frames x 4 videos = 2.7e-5 in the mean
        assert r["reward_mean"] == pytest.approx(l["reward_mean"], abs=1e-4)
        assert r["train/grad_norm"] == pytest.approx(l["train/grad_norm"], rel=1e-4)  # parts summed once
        assert r["comm/generate/all_to_all_bytes"] > 0 and r["comm/train/all_to_all_bytes"] > 0
    # Bytes: what the ranks counted == what the simulator charges for this config and schedule
    # (sim.sp's all-to-alls and gathers, sim.gangs' FSDP traffic), within 1%
    cfg = load_config(None, _overrides(run, mode, wan, "train.tsp_chunk=1", *SP, *CASES[case]))
    policy = build_policy(cfg.model, progress=False)
    layout = module_layout(policy.module, 4, trainable_state_dict(policy.module))
    predicted = predict_comm(cfg, rt.trace, layout=layout, sp_dims=SpDims.from_module(policy.module), sp_tokens=9)
    assert len(predicted) == len(records)
    sync = "comm/sync/send_bytes"  # relay sends: which step a pull lands in depends on timing
    for rec, pred in zip(records, predicted):
        assert {k for k, v in rec.items() if k.startswith("comm/") and k.endswith("_bytes") and k != sync} == \
            {k for k, v in pred.items() if v and k != sync}
        for k, v in pred.items():
            if k != sync:
                assert rec.get(k, 0) == pytest.approx(v, rel=0.01), (rec["step"], k)
    assert sum(r.get(sync, 0) for r in records) == sum(p[sync] for p in predicted)
    # every (step, group, sample, t) trained exactly once: the sp ranks report their rows once
    assert_trained_exactly_once(rt.trained, rt.cfg, 2)
    assert {len(p) for p in rt.rank_pids.values()} == {2}
    if mode == "gap+tsp+tag":
        assert any(s.kind == "generate" and rt.trace.workers[s.worker] == "trainer" for s in rt.trace.spans)

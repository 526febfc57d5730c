"""Faults: a rollout worker killed mid-step is replaced and nothing is lost or trained twice;
a dead trainer stops the run with a pointer to --resume, and --resume finishes it."""

import pytest

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.runtime.driver import RayDriver
from digenrl.runtime.loop import WorkerLostError
from digenrl.sched import Generate, Train
from tests.helpers.equivalence import assert_matches_single_device
from tests.helpers.exactly_once import assert_trained_exactly_once
from tests.helpers.processes import kill_and_wait

from .conftest import tiny


def _kill(rt, wid):
    kill_and_wait(rt.pids[wid])  # dead before the call is sent: the unit is lost for sure


@pytest.mark.parametrize("sync", ["object-store", pytest.param("nccl", marks=pytest.mark.slow)])
def test_rollout_worker_killed_mid_step(ray_cluster, local_run, tmp_path, sync):
    # 2 rollout workers, trajectories in 2 segments: rollout-0 dies when it is sent the second
    # segment of a step-1 trajectory; the continuation restarts from the latent it left.
    # nccl: rollout-0 heads the relay's chain; rollout-1 below it fetches the next version
    # directly, and the replacement fetches every version directly (runtime/relay.py).
    cfg = load_config(None, tiny(tmp_path / "run", "gap", "runtime.rollout.workers=2",
                                 "runtime.rollout_segment=2", f"runtime.weight_sync={sync}"))
    killed = []

    def fault(rt, wid, unit):
        if (not killed and wid == "rollout-0" and type(unit) is Generate and unit.step == 1
                and unit.t_start > 0):
            killed.append(unit)
            _kill(rt, wid)

    rt = RayDriver(cfg, progress=False, evaluate=False, on_dispatch=fault)
    summary = rt.train()
    assert killed, "the fault was never injected"
    assert summary["scheduler"]["requeued"] >= 1
    assert_trained_exactly_once(rt.trained, cfg, 2)
    lost = [s for s in rt.trace.spans if s.extra and s.extra.get("lost")]
    assert [s.worker for s in lost] == ["rollout-0"]
    assert any(w.startswith("rollout-0#") for w in rt.trace.workers)  # the replacement joined
    assert_matches_single_device(tmp_path / "run", local_run)  # gap is on-policy


@pytest.mark.slow  # the nodes tier loses a trainer node too; the default tier keeps the rollout kill
def test_trainer_death_points_to_resume(ray_cluster, local_run, tmp_path):
    overrides = tiny(tmp_path / "run", "gap", "run.checkpoint_every=1")

    def fault(rt, wid, unit):
        if wid == "trainer-0" and type(unit) is Train and unit.step == 1:
            _kill(rt, wid)

    with pytest.raises(WorkerLostError, match="--resume"):
        RayDriver(load_config(None, overrides), progress=False, evaluate=False, on_dispatch=fault).train()
    RayDriver(load_config(None, overrides), progress=False, evaluate=False).train(resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    assert_matches_single_device(tmp_path / "run", local_run)

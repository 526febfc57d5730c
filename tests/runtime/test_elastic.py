"""Elastic rollout pool: `digenrl scale` requests (validated before they are written,
consumed once), the event loop joining and draining workers on Ray (emulated compute), and
a real run that gains 2 rollout workers mid-run and drains 1 mid-step: every sample is
trained exactly once and an on-policy run still ends at the single-device weights."""

import json
import os
from collections import Counter

import pytest
import ray

from digenrl.tools.cli import main as cli
from digenrl.config.schema import load_config
from digenrl.runtime.driver import RayDriver
from digenrl.runtime import scale
from digenrl.runtime.emulated import EmulatedBackend
from digenrl.runtime.loop import EventLoop
from digenrl.runtime.scale import LOG, STATE
from digenrl.sched import Generate, SchedConfig, Scheduler, Worker

from ..sched.sched_helpers import COST, const_cost
from .conftest import tiny
from tests.helpers.equivalence import assert_matches_single_device
from tests.helpers.exactly_once import assert_trained_exactly_once


def _state(run, **kw):
    state = {"mode": "gap", "tag": False, "can_add_rollout": True, "rollout": ["rollout-0", "rollout-1"],
             "draining": [], "joining": [], "reward": []}
    scale.write_state(run, {**state, **kw})  # this process's pid: a live run


def test_requests_are_validated_then_queued_once(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(["scale", "--run-dir", str(run), "rollout=+1"]) == 2
    run.mkdir()
    assert cli(["scale", "--run-dir", str(run), "rollout=+1"]) == 2
    assert "no running run" in capsys.readouterr().err
    _state(run)
    refusals = {"trainer=+1": "optimizer state", "rollout=+x": "not a whole number",
                "rollout=-2": "minimum is 1", "rollout=0": "minimum is 1", "rollout+1": "expected ROLE"}
    for spec, why in refusals.items():
        assert cli(["scale", "--run-dir", str(run), spec]) == 2, spec
        assert why in capsys.readouterr().err, spec
    assert cli(["scale", "--run-dir", str(run), "rollout=+3"]) == 0
    assert "adding 3; rollout workers 2 -> 5;" in capsys.readouterr().out
    # queued requests count: 5 after the +3, so -4 is allowed, then one more -1 is not
    assert cli(["scale", "--run-dir", str(run), "rollout=-4"]) == 0
    assert cli(["scale", "--run-dir", str(run), "rollout=-1"]) == 2
    assert "after the queued requests" in capsys.readouterr().err
    taken = scale.take(run)
    assert [str(r) for _, r, _ in taken] == ["rollout=+3", "rollout=-4"]
    assert scale.take(run) == []  # consumed once
    # TAG modes may go to zero with --allow-empty; colocated runs have no rollout pool
    _state(run, mode="gap+tsp+tag", tag=True)
    assert cli(["scale", "--run-dir", str(run), "rollout=-2"]) == 2
    assert cli(["scale", "--run-dir", str(run), "--allow-empty", "rollout=-2"]) == 0
    scale.take(run)
    _state(run, mode="colocated", rollout=[])
    assert cli(["scale", "--run-dir", str(run), "rollout=+1"]) == 2
    assert "colocated" in capsys.readouterr().err
    _state(run, can_add_rollout=False)
    assert cli(["scale", "--run-dir", str(run), "rollout=+1"]) == 2
    # a driver that died without cleaning up
    scale.write_state(run, {"mode": "gap"})
    state = json.loads((run / STATE).read_text())
    (run / STATE).write_text(json.dumps({**state, "pid": _dead_pid()}))
    assert cli(["scale", "--run-dir", str(run), "rollout=+1"]) == 2
    assert "no longer running" in capsys.readouterr().err


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.mark.parametrize("mode", ["gap", "digenrl"])
def test_event_loop_joins_and_drains_on_ray(ray_cluster, mode):
    # emulated workers (sleeps, no torch): the loop's poll joins a worker and drains two mid-run
    cfg = SchedConfig(mode=mode, rl_steps=3, groups_per_step=4, samples_per_group=2, micro_batch_groups=1,
                      num_steps=4, tsp_chunk=2, rollout_segment=1)
    sched = Scheduler(cfg, [Worker("r0", "rollout"), Worker("r1", "rollout"), Worker("t0", "trainer")])
    # const_cost: a closure over digenrl.sched only, so the actors do not import this module (torch)
    backend = EmulatedBackend(sched.workers, const_cost(COST, cfg.samples_per_group), time_scale=0.02)
    done = []

    def poll(loop):
        if not done and sched.version == 0 and "r0" in sched.in_flight:
            backend._spawn(Worker("r2", "rollout"))
            loop.join(Worker("r2", "rollout"))
            loop.drain("r0")  # mid-trajectory: hands over at its next boundary
            done.append("r0")
        elif done == ["r0"] and sched.version == 1 and "r1" in sched.in_flight:
            loop.drain("r1")
            done.append("r1")

    try:
        trace = EventLoop(sched, backend, poll=poll, poll_s=0.01).run()
    finally:
        backend.close()
    assert done == ["r0", "r1"] and [w.id for w in sched.workers] == ["t0", "r2"]
    got = Counter((s.unit.step, g, t) for s in trace.spans if s.kind == "train"
                  for g in s.unit.groups for t in s.unit.t_steps)
    assert got == Counter((k, g, t) for k in range(3) for g in range(4) for t in cfg.trained(k))
    assert sched.stats["restarts"] == 0
    for w in ("r0", "r1"):  # left, and ran nothing after
        leave = trace.alive[w][1]
        assert leave is not None and all(s.end <= leave + 1e-6 for s in trace.spans if s.worker == w)
    assert trace.alive["r2"][0] > 0 and any(s.worker == "r2" and s.kind == "sync" for s in trace.spans)
    assert "r0" not in backend.handles and "r1" not in backend.handles  # actors stopped


@pytest.mark.slow  # real compute: two extra actors start up (~50-90 s on a shared 2-core machine)
def test_scale_up_and_drain_mid_run(ray_cluster, local_run, tmp_path, capsys):
    run = tmp_path / "run"
    cfg = load_config(None, tiny(run, "gap", "runtime.rollout_segment=2"))
    asked, busy = [], []

    def requests(rt, wid, unit):
        if type(unit) is not Generate:
            return
        if not asked and unit.step == 0:
            assert (run / STATE).exists()  # the CLI validates against the live driver's pools
            assert cli(["scale", "--run-dir", str(run), "rollout=+2"]) == 0
            asked.append("+2")
        elif asked == ["+2"] and unit.step == 1:
            # Step 1's first trajectory, segment [0, 2), goes to `wid`. A tiny step is quicker
            # than an actor start-up: wait for the two new actors, and poll now (the loop polls
            # after this batch of dispatches, too late for this step) so they join mid-run.
            el = rt.elastic
            ray.get([r for _, refs, _deadline in el.joining.values() for r in refs])
            el.poll(el.loop)
            assert cli(["scale", "--run-dir", str(run), "rollout=-1"]) == 0
            el._last = 0.0
            el.poll(el.loop)  # takes the request: drains an idle newcomer, which leaves at once
            el.loop.drain(wid)  # what a request drains when nobody is idle: a worker mid-trajectory
            asked.append("-1")
            busy.append((wid, unit))

    rt = RayDriver(cfg, progress=False, evaluate=False, on_dispatch=requests)
    summary = rt.train()
    assert asked == ["+2", "-1"]
    assert "adding 2; rollout workers 1 -> 3;" in capsys.readouterr().out
    assert not (run / STATE).exists()  # the run is over: scale refuses
    assert cli(["scale", "--run-dir", str(run), "rollout=+1"]) == 2

    log = [json.loads(line) for line in (run / LOG).read_text().splitlines()]
    answers = [r for r in log if "request" in r]
    assert [(r["request"], r["ok"], r["before"], r["after"]) for r in answers] == \
        [("rollout=+2", True, 1, 3), ("rollout=-1", True, 3, 2)]
    assert answers[0]["adding"] == ["rollout-1", "rollout-2"]
    assert sorted(r["joined"] for r in log if "joined" in r) == ["rollout-1", "rollout-2"]
    (idle,) = answers[1]["draining"]
    (stays,) = {"rollout-1", "rollout-2"} - {idle}
    (wid, first), = busy
    assert [r["left"] for r in log if "left" in r] == [idle, wid]

    assert_trained_exactly_once(rt.trained, cfg, 2)
    # the busy worker handed its trajectory over at t=2 (the latent it left), no restart
    assert summary["scheduler"]["drain_handovers"] == 1 and summary["scheduler"]["restarts"] == 0
    tr = rt.trace
    cont = [s for s in tr.spans if s.kind == "generate" and s.unit.t_start == first.t_end
            and (s.unit.step, s.unit.mb) == (first.step, first.mb)]
    assert [s.worker for s in cont] == [stays]
    # alive intervals: the new workers joined mid-run, the drained ones left before the end;
    # the one that stays loaded the weights before generating
    for w in ("rollout-1", "rollout-2"):
        assert 0 < tr.alive[w][0] < tr.end
    mine = sorted((s for s in tr.spans if s.worker == stays), key=lambda s: s.start)
    assert mine[0].kind == "sync" and mine[0].unit.version == 1
    for w in (idle, wid):
        assert tr.alive[w][1] is not None and tr.alive[w][1] <= tr.end
        assert all(s.end <= tr.alive[w][1] + 1e-6 for s in tr.spans if s.worker == w)
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    assert {(e["name"], e["ts"]) for e in events if e.get("cat") == "pool"} >= \
        {("leave", tr.alive[wid][1] * 1e6), ("join", tr.alive[stays][0] * 1e6)}
    # gap is on-policy: the new workers generated with synced weights, the run ends at the
    # single-device weights
    assert_matches_single_device(run, local_run)

"""Autoscaled rollout pools (runtime/autoscale.py): what is asked of Ray's autoscaler, one
worker added per poll while there is room, and (tier `nodes`) a cluster whose autoscaler
starts fake nodes: the request made, spot workers joined as their nodes came up, their nodes
reclaimed (one after a drain, one under its unit), and the pool refilled on the nodes started
in their place. The notices come as on a cloud: each spot node's metadata watcher
(runtime/cloud_notices.py) polls a fake AWS metadata service (tests/helpers/fake_metadata.py),
which answers per node, and writes the notice files the driver reads."""

import pytest
import ray

from digenrl.config.schema import load_config
from digenrl.runtime.autoscale import Autoscaler, cluster_request, pool_bundles
from digenrl.runtime.emulated import PREEMPT_POLL_S, EmulatedBackend, EmulatedLoop, EmulatedWorker
from digenrl.runtime.cloud_notices import Watchers
from digenrl.runtime.preempt import FileNotices, Preemption, polls
from digenrl.sched import SchedConfig, Scheduler, Worker

from ..sched.sched_helpers import COST, const_cost
from tests.helpers.autoscaling_cluster import HEAD_ID, autoscaling_cluster, parent_pid, reclaim
from tests.helpers.fake_metadata import FakeMetadata
from tests.helpers.ray_cluster import leave_shared_ray_cluster


def _cfg(*extra):
    return load_config(None, ["run.mode=gap", "runtime.rollout.workers=1", "runtime.rollout.max_workers=3",
                              "runtime.trainer.workers=2", *extra])


def test_the_request_is_every_pool_with_the_rollout_pool_at_max_workers():
    cfg = _cfg("runtime.rollout.num_cpus=2", "runtime.rollout.num_gpus=1", "runtime.rollout.accelerator=L40S",
               "runtime.rollout.resources={spot: 1}")
    spot = {"CPU": 2.0, "GPU": 1.0, "accelerator_type:L40S": 0.001, "spot": 1}
    assert cluster_request(cfg) == [{"CPU": 1.0}] * 2 + [spot] * 3  # trainers as they are, rollout at 3
    gang = _cfg("runtime.rollout.gang=2", "model.name=wan", "model.path=/m").runtime.rollout
    assert pool_bundles(gang, 3) == [{"CPU": 1.0}] * 6  # a rank per bundle


def test_poll_adds_one_worker_per_poll_while_there_is_room_up_to_max():
    asked, added = [], []
    room = [True]
    pool = {"n": 1}

    def add(why):
        added.append(why)
        pool["n"] += 1
        return f"rollout-{pool['n']}"

    a = Autoscaler(_cfg(), lambda loop: pool["n"], add, every_s=0.0, request=lambda **kw: asked.append(kw),
                   room=lambda: room[0])
    a.start()
    assert len(asked[0]["bundles"]) == 5
    a.poll(None)
    assert a.added == ["rollout-2"] and "1 of runtime.rollout.max_workers=3" in added[0]
    room[0] = False  # no free node: nothing started
    a.poll(None)
    assert a.added == ["rollout-2"]
    room[0] = True
    a.poll(None)
    a.poll(None)  # at max_workers: no more
    assert a.added == ["rollout-2", "rollout-3"]
    pool["n"] = 2  # one left (drained on a notice, or lost): refilled when there is room
    a.poll(None)
    assert a.added == ["rollout-2", "rollout-3", "rollout-3"]
    a.close()
    assert asked[-1] == {"bundles": []}  # the request withdrawn


class _SpotJoiner:
    """Starts emulated rollout workers that need a `spot` node and joins each once it is up,
    registered on its node in `notices` (as a real spot worker registers itself).
    slow: {worker: factor} for workers whose units take that much longer in wall time."""

    def __init__(self, backend: EmulatedBackend, slow: dict[str, float], notices):
        self.backend, self.slow, self.notices = backend, slow, str(notices)
        self.joining, self.joined, self.raylet, self.spot_nodes, self.node = {}, [], {}, {}, {}

    def add(self, why: str) -> str:
        wid = f"spot-{len(self.joined) + len(self.joining)}"
        b = self.backend
        h = ray.remote(EmulatedWorker).options(num_cpus=1, resources={"spot": 1}, max_restarts=0).remote(
            Worker(wid, "rollout"), b._fn_ref, b.scale * self.slow.get(wid, 1.0), b.latency)
        self.joining[wid] = (h, h.pid.remote())
        return wid

    def poll(self, loop) -> None:
        for wid, (h, pid) in list(self.joining.items()):
            if not ray.wait([pid], timeout=0)[0]:
                continue
            del self.joining[wid]
            self.raylet[wid] = parent_pid(ray.get(pid))  # the node's raylet started the worker process
            self.node[wid] = ray.get(h.register_node.remote(self.notices))
            self.spot_nodes[wid] = ray.cluster_resources().get("spot", 0)
            w = Worker(wid, "rollout")
            self.backend.handles[wid], self.backend.workers[wid] = h, w
            self.backend.cache.handles.append(h)
            loop.join(w)
            self.joined.append(wid)

    def count(self, loop) -> int:
        """The spot workers in the pool and not draining, and those starting (r0, the on-demand
        worker on the head, is outside what the autoscaler keeps)."""
        sched = loop.sched
        spot = [w for w in sched.workers if w.id.startswith("spot-") and w.id not in sched.draining]
        return len(spot) + len(self.joining)


class _Enough(Exception):
    pass


@pytest.mark.nodes  # a head and 4 fake nodes started by Ray's autoscaler (~1-2 min on 2 shared cores)
def test_autoscaler_brings_nodes_and_replaces_the_ones_preempted(tmp_path):
    """Two spot nodes come up for the request and their workers join. The provider reclaims
    both: spot-0 is noticed well ahead, drains, leaves, and then its node goes; spot-1 is
    noticed with no time left while it works, so its node goes at once, under its unit, which
    the scheduler gives to another worker. Each time the autoscaler notices the dead node,
    terminates it, starts another for the standing request, and the pool is refilled there.
    Each notice is the fake AWS metadata service's answer for that node, which the node's
    watcher writes as the worker's notice file."""
    leave_shared_ray_cluster()
    notices = tmp_path / "notices"
    with autoscaling_cluster(head_cpus=2, spot_cpus=1, max_spot=2), FakeMetadata("aws") as imds:
        assert ray.cluster_resources().get("spot", 0) == 0  # no spot node before the request
        # two spot workers, one per node; r0 is an on-demand worker on the head, so the pool has a
        # worker before any node is up, and it is not in the request
        cfg = _cfg("runtime.rollout.resources={spot: 1}", "runtime.rollout.max_workers=2")
        sc = SchedConfig(mode="gap", rl_steps=100000, groups_per_step=2, samples_per_group=2, micro_batch_groups=1,
                         num_steps=2, tsp_chunk=2, rollout_segment=1)
        sched = Scheduler(sc, [Worker("r0", "rollout"), Worker("t0", "trainer")])
        backend = EmulatedBackend(sched.workers, const_cost(COST, sc.samples_per_group), time_scale=0.01)
        # spot-1's units last 100x longer (2 s of wall time): one is surely in flight when its node goes
        joiner, asked = _SpotJoiner(backend, slow={"spot-1": 100.0}, notices=notices), []
        # a watcher on each spot node, polling the fake IMDS at {its url}/n/<node id>
        watchers = Watchers("aws", imds.url + "/n/{node_id}", notices, poll_s=0.2, notice_s=30.0, every_s=0.2)
        request = ray.autoscaler.sdk.request_resources

        def record(**kw):
            asked.append(kw)
            request(**kw)

        scaler = Autoscaler(cfg, joiner.count, joiner.add, every_s=0.5, request=record)
        seen = {}

        def kill(wid):  # past a deadline the provider takes the node, the worker's process with it
            seen.setdefault("cut", loop.sched.in_flight.get(wid))  # the unit it takes with it
            reclaim(joiner.raylet[wid])

        spot = Preemption([FileNotices(notices, 30.0)], clock=lambda loop: loop.now(), kill=kill)

        def phases(loop):
            workers = {w.id for w in loop.sched.workers}
            if "honoured" not in seen and len(joiner.joined) == 2:  # both spot nodes up and in use
                seen["honoured"] = "spot-0"
                imds.set("notice", node=joiner.node["spot-0"], seconds=1e6)  # drained well before its deadline
            elif "honoured" in seen and "left" not in seen and "spot-0" not in workers:
                seen["left"] = loop.now()
                reclaim(joiner.raylet["spot-0"])  # drained and gone: now its node goes
            elif "noticed" not in seen and len(joiner.joined) == 3 and "spot-1" in loop.sched.in_flight:
                seen["noticed"] = True
                imds.set("notice", node=joiner.node["spot-1"], seconds=0.0)  # no time: its node goes under it
            elif len(joiner.joined) == 4 and "spot-1" not in workers:  # (its loss handled: its unit's span is in)
                raise _Enough

        loop = EmulatedLoop(sched, backend, stall_s=300, poll_s=PREEMPT_POLL_S,
                            poll=polls(joiner.poll, watchers.poll, spot.poll, phases, scaler.poll))
        scaler.start()
        try:
            with pytest.raises(_Enough):  # the run itself is 10^5 steps long: it stops here
                loop.run()
            stats = spot.finish(loop)
            nodes = [n for n in ray.nodes() if n["NodeID"] != HEAD_ID]
        finally:
            watchers.close()
            scaler.close()
            backend.close()
        # the notices came from the metadata service, through a watcher on each reclaimed node
        assert {r["worker"] for r in spot.log if r["event"] == "notice"} == {"spot-0", "spot-1"}
        # one watcher per spot node, started as its worker registered (the last, spot-3's, may not have
        # been started yet when the test stopped the run); two workers that register within one of the
        # watchers' polls are started in node-id order, so the check is on the set, each node once
        spot_nodes = [joiner.node[w] for w in joiner.joined]
        assert len(watchers.watched) == len(set(watchers.watched)) and len(set(spot_nodes)) == 4
        assert set(watchers.watched) in (set(spot_nodes), set(spot_nodes[:3]))
        assert sorted(p.name for p in notices.iterdir() if not p.name.startswith(".")) == ["spot-0", "spot-1"]
        assert any(path == "/latest/meta-data/spot/instance-action" for _, path, _ in imds.requests)
        assert asked[0] == {"bundles": cluster_request(cfg)} and asked[-1] == {"bundles": []}
        assert sum(1 for b in asked[0]["bundles"] if b.get("spot")) == 2
        assert joiner.joined == ["spot-0", "spot-1", "spot-2", "spot-3"]
        assert joiner.spot_nodes["spot-1"] == 2  # the autoscaler started both nodes
        assert stats["notices"] == 2 and stats["honoured"] == 1 and stats["killed"] == 1
        # four nodes in all, one per worker: the two reclaimed are dead, their replacements alive
        raylets = [joiner.raylet[w] for w in joiner.joined]
        assert len(set(raylets)) == 4, raylets
        assert sorted(n["Alive"] for n in nodes) == [False, False, True, True], nodes
        tr = loop.trace
        assert any(s.worker == "spot-0" and s.kind == "generate" and not s.extra.get("lost") for s in tr.spans)
        assert tr.alive["spot-2"][0] >= seen["left"]  # the refill came after spot-0 had left
        # spot-1's unit was lost with its node, and another worker did it again; or, a short unit
        # (a WeightSync), it finished as the node went and its result came back first; CI's slow
        # tier failed once on a WeightSync with no lost span. Each outcome is checked, not the race
        # between them, and the run stops only once spot-1 is out of the scheduler
        cut = seen["cut"]
        assert cut is not None
        lost = [s for s in tr.spans if s.worker == "spot-1" and s.extra.get("lost")]
        if lost:
            assert [s.unit for s in lost] == [cut]
            assert any(s.unit == cut and s.worker != "spot-1" and not s.extra.get("lost") for s in tr.spans)
        else:
            assert any(s.unit == cut and s.worker == "spot-1" for s in tr.spans)

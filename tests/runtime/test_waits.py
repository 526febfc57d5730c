"""No silent waits: each blocking wait of the driver gives up within its deadline, with a message
naming the cause (docs/guides/running.md, "Waits and their deadlines").

Deadlines here are half a second; the clock bounds only how long a failure may take (BOUND_S),
never whether a test passes: every wait tested waits for something that never comes, and the
pools that must be placed ask for nothing (num_cpus=0: no wait), so no deadline can pass early.

A placement that can never succeed on a cluster that cannot grow is refused at once, not at its
deadline: tested with the cluster's node totals and its autoscaler injected (`cluster.node_totals`,
`cluster.can_grow`), and with a deadline (600 s) no test could wait out. The deadline tests above
them run as on a cluster that may grow (`may_grow`), where the deadline decides."""

import dataclasses
import re
import socket
import time

import pytest

from digenrl.config.runtime import PoolConfig
from digenrl.config.schema import load_config
from digenrl.runtime import cluster
from digenrl.runtime.cluster import _check_reachable, fits_now, infeasible
from digenrl.runtime.driver import RayDriver
from digenrl.runtime.waits import WaitTimeout, wait_all, within
from digenrl.tools.cli import main

from tests.helpers.schedulers import small_digenrl_scheduler

from .conftest import tiny

ray = pytest.importorskip("ray")

BOUND_S = 60.0  # a failure that takes longer than this counts as a hang
FAST = ("runtime.placement_timeout_s=0.5", "runtime.trainer.num_cpus=0")  # the trainer pool asks for nothing


def _fails_in_time(cfg) -> str:
    """Run `cfg` on the shared cluster; it must raise WaitTimeout within BOUND_S: its message."""
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as e:
        RayDriver(cfg, progress=False, evaluate=False).train()
    assert time.monotonic() - t0 < BOUND_S
    return str(e.value)


@pytest.fixture
def may_grow(monkeypatch):
    """As on a cluster with an autoscaler: a placement it lacks the room for waits for its deadline."""
    monkeypatch.setattr(cluster, "can_grow", lambda: True)


@pytest.fixture
def fixed(monkeypatch):
    """As on a cluster with no autoscaler."""
    monkeypatch.setattr(cluster, "can_grow", lambda: False)


def test_first_placement_of_a_rollout_pool_names_the_resource_the_cluster_lacks(ray_cluster, may_grow, tmp_path):
    # the case: accelerator labels on a cluster that has none (RAY_ADDRESS=local)
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.rollout.accelerator=L40S", *FAST))
    msg = _fails_in_time(cfg)
    assert "pool 'rollout'" in msg and "runtime.placement_timeout_s" in msg
    assert "accelerator_type:L40S (one worker asks 0.001; no node has it)" in msg
    assert "runtime.rollout.workers" in msg  # what to change


def test_first_placement_of_the_trainer_pool_names_the_resource_the_cluster_lacks(ray_cluster, may_grow, tmp_path):
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.trainer.resources={trainer_node: 1}",
                                 "runtime.placement_timeout_s=0.5"))
    msg = _fails_in_time(cfg)
    assert "pool 'trainer'" in msg and "placement group" in msg
    assert "trainer_node (one worker asks 1; no node has it)" in msg


def test_placement_names_a_resource_the_cluster_has_but_not_free(ray_cluster, may_grow, tmp_path):
    # the test cluster has 4 CPUs, one node: a worker of 3 fits, two do not
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.rollout.workers=2", "runtime.rollout.num_cpus=3", *FAST))
    msg = _fails_in_time(cfg)
    assert "in use by other workers or jobs: CPU (2 x 3 asked, 4 free)" in msg


def test_digenrl_train_gives_up_with_exit_code_4_and_no_traceback(ray_cluster, may_grow, tmp_path, capsys):
    code = main(["train", *tiny(tmp_path, "gap"), "runtime.rollout.accelerator=L40S", *FAST])
    err = capsys.readouterr().err
    assert code == 4 and "gave up waiting" in err and "accelerator_type:L40S" in err
    assert "Traceback" not in err


NEVER = "runtime.placement_timeout_s=600"  # a deadline no test waits out: a refusal must come at once


def test_what_can_never_be_placed():
    node = {"CPU": 4.0, "GPU": 2.0, "accelerator_type:L40S": 1.0}
    one = {"CPU": 1.0, "GPU": 1.0, "accelerator_type:L40S": 0.001}
    assert infeasible(one, 4, "SPREAD", [node, node]) is None  # 4 GPUs in all
    assert infeasible(one, 5, "SPREAD", [node, node]) == "the cluster has too little GPU (5 x 1 asked, 4 in all)"
    assert infeasible(one, 5, "PACK", [node, node]) == "the cluster has too little GPU (5 x 1 asked, 4 in all)"
    assert infeasible({"CPU": 8.0}, 1, "SPREAD", [node, node]) == \
        "the cluster lacks CPU (one worker asks 8; the largest node has 4)"
    assert infeasible({"CPU": 1.0, "accelerator_type:H200": 0.001}, 1, "SPREAD", [node]) == \
        "the cluster lacks accelerator_type:H200 (one worker asks 0.001; no node has it)"
    gang = {"CPU": 1.0, "GPU": 1.0}
    assert infeasible(gang, 2, "STRICT_PACK", [node, node]) is None
    assert "no node holds 3 x" in infeasible(gang, 3, "STRICT_PACK", [node, node])  # 4 GPUs, but 2 a node
    assert infeasible(gang, 3, "PACK", [node, node]) is None  # a gang spread over both
    assert infeasible({"CPU": 1.0}, 3, "SPREAD", []) == "the cluster lacks CPU (one worker asks 1; no node has it)"


def test_which_clusters_can_grow(monkeypatch):
    import json

    import ray.autoscaler.v2.utils as v2
    import ray.experimental.internal_kv as kv

    reports = {}
    monkeypatch.setattr(cluster, "_started_here", None)
    monkeypatch.setattr(v2, "is_autoscaler_v2", lambda fetch_from_server=False: reports.get("v2", False))
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key, **kw: reports.get("status"))
    readonly = "node_" + "ab12" * 14  # Ray's node type for each node of a cluster with no autoscaler
    assert cluster.can_grow()  # the monitor has not reported: the deadline decides
    reports["status"] = json.dumps({"autoscaler_report": {"active_nodes": {readonly: 1},
                                                           "node_type_mapping": {"ab12" * 14: readonly}}})
    assert not cluster.can_grow()  # `ray start` nodes, no provider
    reports["status"] = json.dumps({"autoscaler_report": {"active_nodes": {"head": 1},
                                                           "pending_launches": {"gpu-spot": 2}}})
    assert cluster.can_grow()  # `ray up`: node types of its own
    reports.update(v2=True, status=None)
    assert cluster.can_grow()  # autoscaler v2 (KubeRay)


def test_a_placement_that_can_never_succeed_is_refused_at_once(ray_cluster, fixed, monkeypatch, tmp_path):
    # the case: 2 CPUs in all, the pools ask for 3; before, the run waited placement_timeout_s
    monkeypatch.setattr(cluster, "node_totals", lambda: [{"CPU": 2.0, "memory": 1e9}])
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.rollout.workers=3", NEVER))
    msg = _fails_in_time(cfg)
    assert msg.startswith("pool 'rollout': the cluster cannot place 3 workers of {'CPU': 1.0} (each on any node) "
                          "at all, so it is not waited for: the cluster has too little CPU (3 x 1 asked, 2 in all), "
                          "and no autoscaler can add nodes. Cluster: "), msg
    assert "Ask for less (runtime.rollout.workers / num_cpus" in msg
    # the trainer pool's packed group, and a label no node has
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.trainer.workers=2", "runtime.trainer.accelerator=H200", NEVER))
    msg = _fails_in_time(cfg)
    assert "pool 'trainer'" in msg and "(one placement group, packed) at all" in msg
    assert "the cluster lacks accelerator_type:H200 (one worker asks 0.001; no node has it)" in msg
    # a cluster that could grow waits for its deadline instead (the may_grow tests above)
    monkeypatch.setattr(cluster, "can_grow", lambda: True)
    with pytest.raises(WaitTimeout, match=r"within 0.5 s \(runtime.placement_timeout_s\)"):
        cluster.await_room(PoolConfig(num_cpus=5.0), 1, "rollout", 0.5)  # 4 CPUs here


def test_digenrl_train_refuses_it_with_exit_code_4(ray_cluster, fixed, tmp_path, capsys):
    code = main(["train", *tiny(tmp_path, "gap"), "runtime.rollout.resources={spot: 1}", NEVER])
    err = capsys.readouterr().err
    assert code == 4 and "refused: pool 'rollout'" in err and "spot (one worker asks 1; no node has it)" in err
    assert "no autoscaler can add nodes" in err and "Traceback" not in err


def test_a_replacement_waits_for_its_deadline(ray_cluster, fixed, monkeypatch):
    # a lost node may come back: replacing its worker waits, even on a cluster that cannot grow
    monkeypatch.setattr(cluster, "node_totals", lambda: [{"CPU": 0.0}])
    with pytest.raises(WaitTimeout, match=r"within 0.5 s \(runtime.placement_timeout_s\)"):
        cluster.await_room(PoolConfig(num_cpus=5.0), 1, "rollout (replacing lost worker rollout-0)", 0.5,
                           wait_for_nodes=True)


def test_ray_address_local_starts_the_local_cluster_the_run_would_start(monkeypatch):
    # RAY_ADDRESS=local, as Ray's docs use it: a local cluster sized for the pools (labels included),
    # never joined as an existing one (it had 2 CPUs and no labels, and the run waited 120 s)
    calls = []
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(cluster.ray, "get_runtime_context", lambda: type("C", (), {"gcs_address": "127.0.0.1:1"})())
    monkeypatch.setattr(cluster, "_started_here", None)
    pools = [(PoolConfig(num_cpus=1.0, accelerator="L40S"), 6), (PoolConfig(num_cpus=2.0, resources={"t": 1.0}), 1)]
    for address in ("local", "LOCAL", " local "):
        monkeypatch.setenv("RAY_ADDRESS", address)
        assert cluster.cluster_address(None) is None
        assert cluster.connect(None, pools) is True
        kw = calls.pop()
        assert kw["address"] == "local" and kw["num_cpus"] >= 8
        assert kw["resources"] == {"accelerator_type:L40S": 1.0, "t": 1.0}
    assert cluster._started_here == "127.0.0.1:1" and not cluster.can_grow()  # the cluster it started is fixed
    assert cluster.connect("local", pools) is True and calls.pop()["address"] == "local"  # runtime.address=local too
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert cluster.cluster_address(None) == "10.0.0.5:6379" and cluster.cluster_address("auto") == "auto"


@pytest.mark.parametrize("mode, token, says", [
    (None, None, "it refused this driver, which sends no token (RAY_AUTH_MODE is not token): the cluster wants Ray's token"),
    ("token", "a" * 32, "it refused this driver's token, which is not the cluster's"),
])
def test_a_cluster_that_wants_rays_token_refuses_the_driver_at_once(monkeypatch, mode, token, says):
    # Ray's token authentication: the GCS answers "Unauthenticated" (injected here; the nodes tier
    # runs it for real), and the driver stops with a message instead of ray.init's 20 s of retries
    import ray._raylet
    from ray.exceptions import AuthenticationError

    def gcs_client(address):
        raise AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")

    monkeypatch.setattr(ray._raylet, "GcsClient", gcs_client)
    for key, value in (("RAY_AUTH_MODE", mode), ("RAY_AUTH_TOKEN", token)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    with pytest.raises(cluster.ClusterRefused, match=f"Ray cluster at '10.0.0.5:6379' .*: {re.escape(says)}. "
                                                     "To join it, set RAY_AUTH_MODE=token and give the cluster's token"):
        cluster._check_token("10.0.0.5:6379")
    monkeypatch.setattr(ray._raylet, "GcsClient", lambda address: None)  # the token checks out
    cluster._check_token("10.0.0.5:6379")


def test_the_event_loops_watchdog_names_the_units_in_flight(ray_cluster):
    # every unit is a task asking for a resource no node has: it never runs, never finishes
    from digenrl.runtime.loop import EventLoop

    @ray.remote(num_cpus=0, resources={"no_such_node": 1})
    def never():
        pass

    class Stuck:
        sent: list = []

        def dispatch(self, wid, unit):
            self.sent.append(never.remote())
            return self.sent[-1:]

    t0 = time.monotonic()
    try:
        with pytest.raises(WaitTimeout) as e:
            EventLoop(small_digenrl_scheduler(), Stuck(), stall_s=0.5).run()
    finally:
        for ref in Stuck.sent:
            ray.cancel(ref)
    assert time.monotonic() - t0 < BOUND_S
    msg = str(e.value)
    assert msg.startswith("runtime stalled: no unit finished for 0.5 s (runtime.stall_timeout_s)")
    running = msg.split("running: ")[1]
    assert "r0 generate (" in running and "r1 generate (" in running  # which worker runs what, how long
    assert "version=0" in msg  # the scheduler's state


def test_wait_all_names_who_did_not_answer(ray_cluster):
    @ray.remote(num_cpus=0, resources={"no_such_node": 1})
    def never():
        pass

    late = never.remote()  # never placed, never runs
    try:
        with pytest.raises(WaitTimeout, match=r"^loading: no answer from w1 within 0.5 s \(some.key\); because$"):
            wait_all({"w0": ray.put(0), "w1": [ray.put(1), late]}, timeout_s=0.5, what="loading", key="some.key",
                     hint=lambda: "because")
    finally:
        ray.cancel(late)
    assert wait_all({"a": ray.put(1), "b": [ray.put(2), ray.put(3)]}, timeout_s=BOUND_S, what="x",
                    key="k") == {"a": 1, "b": [2, 3]}
    # within: the deadline and the key from the run's config section
    runtime = load_config(None).runtime
    late = never.remote()
    try:
        with pytest.raises(WaitTimeout, match=r"^stepping: no answer from w1 within 0.5 s \(runtime.stall_timeout_s\)$"):
            within(dataclasses.replace(runtime, stall_timeout_s=0.5), "stall", {"w1": late}, "stepping")
    finally:
        ray.cancel(late)
    assert within(runtime, "start", {"a": ray.put(4)}, "x") == {"a": 4}


def test_fits_now_checks_every_resource_the_evaluation_actor_asks(ray_cluster):
    assert fits_now(PoolConfig(num_cpus=0.0))  # asks for nothing
    assert not fits_now(PoolConfig(num_cpus=0.0, num_gpus=1.0))  # the test cluster has no GPU
    assert not fits_now(PoolConfig(num_cpus=0.0, resources={"rollout_node": 1.0}))
    assert not fits_now(PoolConfig(num_cpus=0.0, accelerator="L40S"))


def test_an_address_where_nothing_listens_is_refused_at_once():
    with socket.socket() as s:  # a port nothing listens on (free once closed)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(WaitTimeout, match=rf"nothing answers at 127.0.0.1:{port}.*ray start --head"):
        _check_reachable(f"127.0.0.1:{port}", timeout_s=5)
    _check_reachable("auto")  # no port: left to ray.init


def test_an_elastic_addition_that_never_comes_up_is_stopped_and_its_join_answered(ray_cluster, tmp_path):
    # `digenrl scale rollout=+1` starts a worker that is never placed: the run goes on, and
    # after placement_timeout_s + start_timeout_s the worker is stopped with an answer saying so
    import json

    from digenrl.runtime import scale
    from digenrl.runtime.elastic import Elastic
    from digenrl.sched import Worker

    @ray.remote(num_cpus=0, resources={"no_such_node": 1})
    def never():
        pass

    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.placement_timeout_s=0.1", "runtime.start_timeout_s=0.1"))

    class Actors:  # what Elastic asks of runtime/actors.Actors
        def __init__(self):
            self.cfg, self.workers, self.retired, self.refs = cfg, [Worker("r0", "rollout")], [], []

        def add_rollout(self):
            self.refs.append(never.remote())
            return Worker("rollout-9", "rollout"), self.refs[-1:]

        def retire(self, worker):
            self.retired.append(worker.id)

    class Loop:
        sched = small_digenrl_scheduler()

    actors, loop = Actors(), Loop()
    elastic = Elastic(actors, tmp_path, every_s=0.0)
    elastic.start(loop)
    assert main(["scale", "--run-dir", str(tmp_path), "rollout=+1"]) == 0
    t0 = time.monotonic()
    try:
        while not actors.retired and time.monotonic() - t0 < BOUND_S:
            elastic.poll(loop)
            time.sleep(0.05)
    finally:
        elastic.close()
        for ref in actors.refs:
            ray.cancel(ref)
    assert actors.retired == ["rollout-9"] and not elastic.joining
    answers = [json.loads(line) for line in (tmp_path / scale.LOG).read_text().splitlines()]
    joined = [a for a in answers if a.get("joined") == "rollout-9"]
    assert len(joined) == 1 and joined[0]["ok"] is False
    assert "not up within 0.2 s (runtime.placement_timeout_s + start_timeout_s)" in joined[0]["error"]
    assert "free now" in joined[0]["error"]

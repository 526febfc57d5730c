"""No silent waits: each blocking wait of the driver gives up within its deadline, with a message
naming the cause (docs/runtime.md, "Waits and their deadlines").

Deadlines here are half a second; the clock bounds only how long a failure may take (BOUND_S),
never whether a test passes: every wait tested waits for something that never comes, and the
pools that must be placed ask for nothing (num_cpus=0: no wait), so no deadline can pass early."""

import dataclasses
import socket
import time

import pytest

from digenrl.config.schema import PoolConfig, load_config
from digenrl.runtime.cluster import _check_reachable, fits_now
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


def test_first_placement_of_a_rollout_pool_names_the_resource_the_cluster_lacks(ray_cluster, tmp_path):
    # the case: accelerator labels on a cluster that has none (RAY_ADDRESS=local)
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.rollout.accelerator=L40S", *FAST))
    msg = _fails_in_time(cfg)
    assert "pool 'rollout'" in msg and "runtime.placement_timeout_s" in msg
    assert "accelerator_type:L40S (one worker asks 0.001; no node has it)" in msg
    assert "runtime.rollout.workers" in msg  # what to change


def test_first_placement_of_the_trainer_pool_names_the_resource_the_cluster_lacks(ray_cluster, tmp_path):
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.trainer.resources={trainer_node: 1}",
                                 "runtime.placement_timeout_s=0.5"))
    msg = _fails_in_time(cfg)
    assert "pool 'trainer'" in msg and "placement group" in msg
    assert "trainer_node (one worker asks 1; no node has it)" in msg


def test_placement_names_a_resource_the_cluster_has_but_not_free(ray_cluster, tmp_path):
    # the test cluster has 4 CPUs, one node: a worker of 3 fits, two do not
    cfg = load_config(None, tiny(tmp_path, "gap", "runtime.rollout.workers=2", "runtime.rollout.num_cpus=3", *FAST))
    msg = _fails_in_time(cfg)
    assert "in use by other workers or jobs: CPU (2 x 3 asked, 4 free)" in msg


def test_digenrl_train_gives_up_with_exit_code_4_and_no_traceback(ray_cluster, tmp_path, capsys):
    code = main(["train", *tiny(tmp_path, "gap"), "runtime.rollout.accelerator=L40S", *FAST])
    err = capsys.readouterr().err
    assert code == 4 and "gave up waiting" in err and "accelerator_type:L40S" in err
    assert "Traceback" not in err


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

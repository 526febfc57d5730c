"""Two Ray nodes on one machine (`ray.cluster_utils.Cluster`): the pools on different nodes,
one node removed mid-run. A lost rollout node takes its actors and every object only it
held (ObjectReconstructionFailedError for the units that read them: the micro-batch is
generated again); a lost trainer node ends the run with the --resume message.

Ray's token authentication (`RAY_AUTH_MODE=token`, a token of the test's own in
`RAY_AUTH_TOKEN`, on every node): a local run and a two-node run under it, and a driver without
the token, or with another, refused with a message in seconds (`cluster._check_token`).

Tier `nodes` (deselected by default): `pytest -m nodes tests/runtime/test_nodes.py`.
"""

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.runtime.driver import RayDriver
from digenrl.runtime.loop import WorkerLostError
from digenrl.sched import Generate, Train

from tests.helpers.equivalence import assert_matches_single_device
from tests.helpers.exactly_once import assert_trained_exactly_once
from tests.helpers.ray_cluster import leave_shared_ray_cluster, own_ray_cluster

from .conftest import tiny

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.nodes

# the GCS declares a removed node dead after ~1.5 s of missed health checks (default ~30 s)
# every task result in a node's object store, as a real model's latents are (Ray keeps results under
# 100 KiB, such as the tiny model's lean rows, in the caller's memory, where a node's loss cannot reach them)
FAST = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3,
        "max_direct_call_object_size": 0}
ROLLOUT, TRAINER = {"node_rollout": 2}, {"node_trainer": 1}
PLACED = ("runtime.rollout.resources={node_rollout: 1}", "runtime.trainer.resources={node_trainer: 1}")


@pytest.fixture
def cluster():
    """A head node for the driver only (no CPU), a trainer node and a rollout node."""
    leave_shared_ray_cluster()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST})
    nodes = {"trainer": c.add_node(num_cpus=1, resources=TRAINER),
             "rollout": c.add_node(num_cpus=2, resources=ROLLOUT)}
    own_ray_cluster(address=c.address)
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def test_rollout_node_lost_mid_step(cluster, local_run, tmp_path):
    # Both rollout workers on one node; when rollout-0 is sent the second segment of a step-1
    # trajectory, a spare rollout node joins and the first one is removed: both workers die,
    # and the latent of that segment (only on the dead node) is gone, so the continuation
    # fails on the replacement and the micro-batch is generated again from t=0.
    c, nodes = cluster
    cfg = load_config(None, tiny(tmp_path / "run", "gap", "runtime.rollout.workers=2",
                                 "runtime.rollout_segment=2", *PLACED))
    killed = []

    def fault(rt, wid, unit):
        if not killed and wid == "rollout-0" and type(unit) is Generate and unit.step == 1 and unit.t_start > 0:
            killed.append(unit)
            c.add_node(num_cpus=2, resources=ROLLOUT)  # where the replacements go
            c.remove_node(nodes["rollout"], allow_graceful=False)

    rt = RayDriver(cfg, progress=False, evaluate=False, on_dispatch=fault)
    summary = rt.train()
    assert killed, "the fault was never injected"
    lost = [s for s in rt.trace.spans if s.extra and s.extra.get("lost")]
    died = {s.worker for s in lost if not s.extra.get("inputs_lost")}
    assert "rollout-0" in died and died <= {"rollout-0", "rollout-1"}  # (rollout-1: if it was busy)
    assert any(s.extra.get("inputs_lost") for s in lost), "no unit found its inputs gone"
    # calls to the dead node's actors raise a RayActorError: ActorDiedError once the GCS has
    # marked the node dead, ActorUnavailableError if the call fails before it has (which one
    # comes first depends on heartbeats; CI saw both). A unit on a live worker reading an object
    # only that node held raises RayTaskError(ObjectReconstructionFailedError) (no lineage).
    errors = {s.extra["error"] for s in lost if not s.extra.get("inputs_lost")}
    assert errors and errors <= {"ActorDiedError", "ActorUnavailableError"}, errors
    assert all("Object" in s.extra["error"] for s in lost if s.extra.get("inputs_lost"))
    assert summary["scheduler"]["restarts"] >= 1
    assert sum(w.startswith("rollout-") and "#" in w for w in rt.trace.workers) >= 1  # replacements
    assert_trained_exactly_once(rt.trained, cfg, 2)
    assert_matches_single_device(tmp_path / "run", local_run)  # gap is on-policy


def test_trainer_node_lost_then_resume(cluster, local_run, tmp_path):
    c, nodes = cluster
    overrides = tiny(tmp_path / "run", "gap", "run.checkpoint_every=1", *PLACED)

    def fault(rt, wid, unit):
        if wid == "trainer-0" and type(unit) is Train and unit.step == 1 and nodes.get("trainer"):
            c.remove_node(nodes.pop("trainer"), allow_graceful=False)

    with pytest.raises(WorkerLostError, match="--resume"):
        RayDriver(load_config(None, overrides), progress=False, evaluate=False, on_dispatch=fault).train()
    assert "trainer" not in nodes, "the fault was never injected"
    c.add_node(num_cpus=1, resources=TRAINER)  # the trainer pool's new node
    RayDriver(load_config(None, overrides), progress=False, evaluate=False).train(resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]
    assert_matches_single_device(tmp_path / "run", local_run)


GANGS = ("runtime.trainer.workers=2", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp",
         "runtime.rollout.workers=2", "runtime.weight_sync=nccl", "runtime.network_interface=lo")


@pytest.fixture
def nodes_of(request):
    """A head node with no CPU for the driver and `request.param` worker nodes of that many CPUs."""
    n_nodes, cpus = request.param
    leave_shared_ray_cluster()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(n_nodes):
        c.add_node(num_cpus=cpus)
    own_ray_cluster(address=c.address)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.mark.parametrize("nodes_of", [(2, 3)], indirect=True)
def test_gangs_node_aligned_and_relay_across_nodes(nodes_of, local_run, tmp_path):
    # Two trainer gangs of 2 and two rollout workers on two nodes of 3 CPUs. One packed group of
    # the 4 trainer ranks (the placement before node alignment) puts ranks 0-2 on one node and
    # rank 3 on the other, so trainer-1's gang straddles; node-aligned, each gang gets a node and
    # the rollout workers take the CPU each node has left: one of them pulls from the relay on
    # trainer-0's node over the other node's loopback interface (runtime.network_interface=lo).
    cfg = load_config(None, tiny(tmp_path / "run", "gap", *GANGS))
    seen = {}

    def look(rt, wid, unit):
        if not seen:
            seen.update(rt.actors.nodes())

    rt = RayDriver(cfg, progress=False, evaluate=False, on_dispatch=look)
    rt.train()
    trainer_nodes = [set(seen[w]) for w in ("trainer-0", "trainer-1")]
    assert all(len(n) == 1 for n in trainer_nodes), f"a trainer gang straddles nodes: {seen}"
    assert trainer_nodes[0] != trainer_nodes[1], seen
    rollout_nodes = {seen[w][0] for w in ("rollout-0", "rollout-1")}
    assert rollout_nodes == trainer_nodes[0] | trainer_nodes[1], f"the relay does not cross nodes: {seen}"
    assert_matches_single_device(tmp_path / "run", local_run)  # gap is on-policy


@pytest.mark.parametrize("nodes_of", [(2, 1)], indirect=True)
def test_gang_larger_than_a_node_spans_nodes(nodes_of, local_run, tmp_path, caplog):
    # No node holds a gang of 2: it is packed across both, with a warning, and trains as one.
    cfg = load_config(None, tiny(tmp_path / "run", "gap", "runtime.trainer.gang=2", "runtime.trainer.shard=fsdp",
                                 "runtime.rollout.workers=1", "runtime.rollout.num_cpus=0"))
    seen = {}

    def look(rt, wid, unit):
        if not seen:
            seen.update(rt.actors.nodes())

    with caplog.at_level("WARNING", logger="digenrl.runtime.actors"):
        RayDriver(cfg, progress=False, evaluate=False, on_dispatch=look).train()
    assert len(set(seen["trainer-0"])) == 2, seen
    assert "no node holds a whole gang of trainer-0" in caplog.text
    assert_matches_single_device(tmp_path / "run", local_run)


# -- Ray's token authentication -----------------------------------------------------------------

@pytest.fixture
def token_auth(monkeypatch):
    """RAY_AUTH_MODE=token and a fresh token (RAY_AUTH_TOKEN) in this process and in every Ray
    process it starts; Ray's cached token state reset on the way in and out."""
    from ray._private.authentication_test_utils import reset_auth_token_state

    leave_shared_ray_cluster()
    token = secrets.token_hex(32)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    reset_auth_token_state()
    yield token
    leave_shared_ray_cluster()
    monkeypatch.undo()
    reset_auth_token_state()


def test_a_local_run_under_token_auth(token_auth, local_run, tmp_path):
    # the run starts its own local cluster (Ray >= 2.59 turns token auth on for those anyway; here
    # it is asked for, with this test's token)
    from ray._raylet import AuthenticationTokenLoader

    rt = RayDriver(load_config(None, tiny(tmp_path / "run", "gap")), progress=False, evaluate=False)
    rt.train()
    assert AuthenticationTokenLoader.instance().get_raw_token() == token_auth
    assert_matches_single_device(tmp_path / "run", local_run)


@pytest.fixture
def token_cluster(token_auth):
    """The `cluster` fixture's layout (driver-only head, a trainer node, a rollout node) with
    token authentication on every node."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": FAST})
    nodes = {"trainer": c.add_node(num_cpus=1, resources=TRAINER),
             "rollout": c.add_node(num_cpus=2, resources=ROLLOUT)}
    own_ray_cluster(address=c.address)
    yield c, nodes, token_auth
    ray.shutdown()
    c.shutdown()


def _driver(address: str, run_dir: Path, *overrides: str, **env) -> tuple[int, str, float]:
    """`digenrl train` in a process of its own, pointed at `address` with `env` for Ray's token
    (HOME empty: no ~/.ray/auth_token to fall back on): (exit code, stderr, seconds)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    full.update(RAY_ADDRESS=address, HOME=str(run_dir.parent / "home"), PYTHONPATH=str(Path(__file__).parents[2]),
                **env)
    (run_dir.parent / "home").mkdir(exist_ok=True)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "digenrl.tools.cli", "train", *tiny(run_dir, "gap", *overrides)],
                          env=full, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr, time.monotonic() - t0


def test_two_nodes_under_token_auth_and_a_driver_without_the_token(token_cluster, local_run, tmp_path):
    c, nodes, token = token_cluster
    cfg = load_config(None, tiny(tmp_path / "run", "gap", *PLACED))
    seen = {}

    def look(rt, wid, unit):
        if not seen:
            seen.update(rt.actors.nodes())

    RayDriver(cfg, progress=False, evaluate=False, on_dispatch=look).train()
    assert set(seen["trainer-0"]) != set(seen["rollout-0"]), seen  # the pools on the two nodes
    assert_matches_single_device(tmp_path / "run", local_run)
    # a driver without the token, or with another: refused at once with a message, not a hang
    # (ray.init alone retried for ~20 s, then raised ConnectionError with a traceback)
    code, err, _ = _driver(c.address, tmp_path / "none")
    assert code == 4 and "Traceback" not in err, err
    assert "it refused this driver, which sends no token (RAY_AUTH_MODE is not token)" in err
    assert "set RAY_AUTH_MODE=token and give the cluster's token in RAY_AUTH_TOKEN" in err
    code, err, _ = _driver(c.address, tmp_path / "wrong", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    assert code == 4 and "it refused this driver's token, which is not the cluster's" in err, err
    code, err, _ = _driver(c.address, tmp_path / "empty", RAY_AUTH_MODE="token")
    assert code == 4 and "RAY_AUTH_MODE=token but no token to send" in err, err
    # the right token in a file (RAY_AUTH_TOKEN_PATH), as the Slurm script gives it, gets past the
    # check and into the cluster: to a pool no node can place (it stops there, quickly)
    path = tmp_path / "token"
    path.write_text(token)
    code, err, _ = _driver(c.address, tmp_path / "file", "runtime.rollout.accelerator=L40S",
                           "runtime.placement_timeout_s=5", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
    assert code == 4 and "refused this driver" not in err and "accelerator_type:L40S" in err, err

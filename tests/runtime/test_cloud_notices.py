"""The clouds' reclaim notices (runtime/cloud_notices.py), each watcher against a fake metadata
service on 127.0.0.1 that answers as its cloud does (tests/helpers/fake_metadata.py): not yet,
a notice, no answer at all, and an answer that does not parse. A notice becomes a notice file for
every spot worker registered on the watcher's node, and none for another node's; FileNotices
(what the driver reads) turns those into Notices with the cloud's deadline, or notice_s, with a
warning, for an answer that does not parse.

Watchers are driven round by round (`NodeWatcher.check`), never by sleeps; the Ray test waits on
what it can see (the notice files), bounded by wait_until.
"""

import json
import os
import socket
import threading
import time

import pytest

from digenrl.runtime import cloud_notices as cn
from digenrl.runtime.preempt import FileNotices
from tests.helpers.fake_metadata import FakeMetadata
from tests.helpers.gates import wait_until

NOTICE_S = 30.0
CLOUDS = ["aws", "gce", "azure"]


@pytest.fixture
def notices(tmp_path):
    """A notices directory with workers w0, w1 on node A and w2 on node B registered."""
    d = tmp_path / "notices"
    cn.register(d, "node-a", "w0", "10.0.0.1")
    cn.register(d, "node-a", "w1", "10.0.0.1")
    cn.register(d, "node-b", "w2", "10.0.0.2")
    return d


def watcher(fake: FakeMetadata, notices, node="node-a", url=None, poll_s=1.0):
    src = cn.source(fake.cloud, url or fake.node_url(node), poll_s)
    return cn.NodeWatcher(src, notices, node, poll_s=poll_s, notice_s=NOTICE_S)


def file_notices(notices) -> dict[str, float]:
    """What the driver's FileNotices reads there: worker -> seconds to its deadline."""
    source = FileNotices(notices, NOTICE_S)
    source.seen.clear()  # read every notice present (the driver's source existed before they came)
    return {n.worker: n.notice_s for n in source.poll(0.0)}


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_not_yet_then_a_notice_for_every_worker_on_the_node(cloud, notices):
    with FakeMetadata(cloud) as fake:
        fake.set("not yet", node="node-a")
        w = watcher(fake, notices)
        for _ in range(3):
            assert w.check() is None
        assert file_notices(notices) == {} and not w.warnings
        fake.set("notice", node="node-a", seconds=90.0)
        assert w.check() is not None
        got = file_notices(notices)
        assert sorted(got) == ["w0", "w1"]  # node B's worker is not noticed
        expected = NOTICE_S if cloud == "gce" else 90.0  # GCE says TRUE and no time: notice_s (30 s there too)
        assert all(abs(s - expected) <= 2.0 for s in got.values()), got
        assert not w.warnings
        # a worker that registers on the noticed node later is noticed at the next round
        cn.register(notices, "node-a", "w3", "10.0.0.1")
        w.check()
        assert "w3" in file_notices(notices)


@pytest.mark.parametrize("cloud", CLOUDS)
def test_an_unreachable_service_is_retried_with_one_warning(cloud, notices):
    with FakeMetadata(cloud) as fake:
        fake.set("notice", node="node-a")
        w = watcher(fake, notices, url=_closed_port_url())
        for _ in range(3):
            assert w.check() is None
        assert file_notices(notices) == {}
        assert len(w.warnings) == 1 and "does not answer" in w.warnings[0], w.warnings
        w.src = cn.source(cloud, fake.node_url("node-a"), 1.0)  # the service is back
        assert w.check() is not None and sorted(file_notices(notices)) == ["w0", "w1"]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_malformed_answer_still_drains_with_a_warning(cloud, notices, monkeypatch):
    # FileNotices' warnings, read at the call: in the full suite logging's own state (handlers,
    # levels, disabled loggers) is whatever other modules on this worker left it in
    from digenrl.runtime import preempt

    warned = []
    monkeypatch.setattr(preempt.log, "warning", lambda message, *args: warned.append(message % args))
    with FakeMetadata(cloud) as fake:
        fake.set("malformed", node="node-a")
        w = watcher(fake, notices)
        assert w.check() is not None
        got = file_notices(notices)
        assert sorted(got) == ["w0", "w1"] and set(got.values()) == {NOTICE_S}  # the default deadline
        assert len(w.warnings) == 1 and "does not parse" in w.warnings[0] and "draining the node all the same" \
            in w.warnings[0]
    # FileNotices warns too, as for any file that does not parse
    assert sum("taking the default deadline" in m for m in warned) == 2, warned


def test_aws_asks_for_the_session_token_first_and_renews_it(notices):
    with FakeMetadata("aws") as fake:
        w = watcher(fake, notices)
        w.check()
        assert [(m, p) for m, p, _ in fake.requests] == [("PUT", "/latest/api/token"),
                                                          ("GET", "/latest/meta-data/spot/instance-action")]
        assert fake.requests[0][2]["x-aws-ec2-metadata-token-ttl-seconds"] == "21600"
        assert fake.requests[1][2]["x-aws-ec2-metadata-token"] == "tok-0"
        w.check()  # the token is kept
        assert [m for m, _, _ in fake.requests].count("PUT") == 1
        fake.tokens.clear()  # it expired early: a 401, a new token, the GET again
        fake.set("notice", node="node-a")
        assert w.check() is not None
        assert [m for m, _, _ in fake.requests][-3:] == ["GET", "PUT", "GET"]


def test_gce_sends_its_header_and_waits_for_a_change(notices):
    with FakeMetadata("gce") as fake:
        fake.set("not yet", node="node-a")
        w = watcher(fake, notices, poll_s=30.0)
        assert w.check() is None  # the first GET reads the value and its ETag
        assert all(h["metadata-flavor"] == "Google" for _, _, h in fake.requests)
        # the next GET hangs (timeout_sec 30) until the value changes: a notice wakes it
        done = threading.Event()
        thread = threading.Thread(target=lambda: (w.check(), done.set()), daemon=True)
        thread.start()
        wait_until(lambda: len(fake.requests) == 2, "the watcher's wait_for_change request")
        _, path, _ = fake.requests[1]
        assert not done.is_set()
        fake.set("notice", node="node-a")
        thread.join(timeout=25)
        assert done.is_set() and sorted(file_notices(notices)) == ["w0", "w1"]
    assert w.src.etag is not None


def test_gce_without_its_header_gets_nothing(notices):
    with FakeMetadata("gce") as fake:
        fake.set("notice")
        import urllib.request
        import urllib.error

        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{fake.url}/computeMetadata/v1/instance/preempted", timeout=5)
        assert e.value.code == 403  # why the watcher sends Metadata-Flavor: Google


def test_azure_acts_on_this_vms_preempt_event_and_acknowledges_it_once_drained(notices):
    with FakeMetadata("azure") as fake:
        fake.set("not yet", node="node-a")
        w = watcher(fake, notices)
        assert w.check() is None  # another VM's Preempt and this VM's Reboot are not its notice
        fake.set("notice", node="node-a", seconds=60.0)
        text = w.check()
        assert json.loads(text)["event"] == "preempt-node-a"
        assert sorted(file_notices(notices)) == ["w0", "w1"] and fake.acks == []  # its workers still drain
        cn.deregister(notices, "w0")
        w.check()
        assert fake.acks == []
        cn.deregister(notices, "w1")  # the last one left: Azure may go ahead now
        w.check()
        w.check()
        assert fake.acks == ["preempt-node-a"]  # once, the event it acted on
        assert all(h["metadata"] == "true" for _, _, h in fake.requests)


def test_registry_and_the_prestop_hook(notices, capsys):
    assert cn.registered(notices) == ["w0", "w1", "w2"]
    assert cn.registered(notices, "node-a") == ["w0", "w1"] and cn.registered(notices, node_ip="10.0.0.2") == ["w2"]
    # the hook knows its pod's address, not Ray's node id
    assert cn.main(["--notices", str(notices), "--node-ip", "10.0.0.2"]) == 0
    assert "notices written for w2" in capsys.readouterr().err
    assert file_notices(notices) == {"w2": NOTICE_S}
    # a notice of this run already there (SIGTERM wrote one) holds; an earlier run's is written over
    (notices / "w0").write_text('{"notice_s": 5}')
    (notices / "w1").write_text('{"notice_s": 7}')
    os.utime(notices / "w1", (1000.0, 1000.0))
    source = FileNotices(notices, NOTICE_S)  # the driver's, made when this run started: both are old to it
    cn.notify_node(notices, "", node_id="node-a", since=2000.0)
    assert json.loads((notices / "w0").read_text()) == {"notice_s": 5} and (notices / "w1").read_text() == ""
    assert [n.worker for n in source.poll(0.0)] == ["w1"]  # the resumed run's w1 is noticed
    cn.clear(notices)
    assert cn.registered(notices) == []


def test_the_watch_keys_are_checked():
    from digenrl.config.errors import ConfigError
    from digenrl.config.schema import load_config

    base = ["run.mode=gap", "runtime.rollout.preemptible=true"]
    cfg = load_config(None, [*base, "runtime.rollout.watch=aws", "runtime.rollout.metadata_url=http://127.0.0.1:9/n/{node_id}"])
    assert cfg.runtime.rollout.watch == "aws"
    for extra, message in [
        (["runtime.rollout.watch=ibm"], "runtime.rollout.watch"),
        (["runtime.rollout.watch=aws", "runtime.rollout.watch_poll_s=0"], "runtime.rollout.watch_poll_s"),
        (["runtime.rollout.metadata_url=http://x"], "set runtime.rollout.watch to one of aws, gce, azure"),
        (["runtime.rollout.watch=gce", "runtime.rollout.metadata_url=metadata.internal"], "http(s):// URL"),
        (["runtime.trainer.watch=aws"], "only the rollout pool"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_config(None, [*base, *extra])
    with pytest.raises(ConfigError, match="acts on spot workers only"):
        load_config(None, ["run.mode=gap", "runtime.rollout.watch=aws"])


@pytest.mark.slow  # a Ray cluster for one test; the nodes tier runs the watchers on every spot node (test_autoscale)
def test_watchers_start_one_actor_per_node_and_drop_workers_that_left(ray_cluster, tmp_path):
    import ray

    from digenrl.sched import Worker

    node = ray.get_runtime_context().get_node_id()
    d = tmp_path / "notices"
    for wid in ("rollout-0", "rollout-1"):
        cn.register(d, node, wid, "127.0.0.1")

    class Loop:
        class sched:
            workers = [Worker("rollout-0", "rollout"), Worker("rollout-1", "rollout"), Worker("trainer-0", "trainer")]

    with FakeMetadata("aws") as fake:
        fake.set("not yet")
        ws = cn.Watchers("aws", fake.url + "/n/{node_id}", d, poll_s=0.1, notice_s=NOTICE_S, every_s=0.0)
        try:
            ws.poll(Loop)
            assert list(ws.actors) == [node]
            state = ray.get(ws.actors[node].state.remote(), timeout=120)
            assert state["node_id"] == node and state["notice"] is None
            Loop.sched.workers = Loop.sched.workers[1:]  # rollout-0 drained and left
            ws.poll(Loop)
            assert cn.registered(d) == ["rollout-1"] and len(ws.actors) == 1
            fake.set("notice", node=node, seconds=45.0)
            wait_until(lambda: (d / "rollout-1").exists(), "the node's watcher to write rollout-1's notice")
            assert set(file_notices(d)) == {"rollout-1"}
            assert any(p == "/latest/api/token" for _, p, _ in fake.requests)
        finally:
            ws.close()

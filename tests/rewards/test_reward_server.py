"""The reward service over loopback: Ray Serve on one small local Ray cluster per module,
its HTTP proxy on an ephemeral port; each server deploys the app there and deletes it after.

Every test ends by checking the server still answers /health and a good request. Rewards run
in replica processes: `Brightness` records its batch sizes in a file both sides read, and
holds a call on the prompt 'slow' at a `FileGate` until the test opens it. Tests order
themselves on what they can see (a gate's "inside" marker, the replica's /health counts, the
answers that came back), never on sleeps; batches are made deterministic by filling them to
max_batch under a long batch_wait_s (a full batch closes at once).
"""

import http.client
import json
import os
import socket
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from digenrl.rewards import build_reward
from digenrl.rewards.base import score_media
from digenrl.rewards.client import RemoteReward, RemoteRewardError
from digenrl.rewards.clip_models import ClipScore
from digenrl.rewards.wire import decode_request, encode_request
from tests.helpers.gates import FileGate, wait_until

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
from digenrl.runtime.serving.reward_server import RewardServer  # noqa: E402 - needs ray[serve]

pytestmark = pytest.mark.timeout(300)  # a hang's net: starting Ray and Serve took 140 s on 2 cores at load 15

PROMPTS = ["a red cat", "a dog on grass", "a red cat", "text saying 42"]
LONG_WAIT_S = 30.0  # a batch_wait_s no test waits out: its batches close by filling up
# Serve restarts a proxy not ready within 5 s, and serve.start() then fails (ActorDiedError):
# on 2 cores at load 15 the proxy took longer. The cluster's processes inherit the driver's env.
SERVE_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}


class Brightness:
    """Mean pixel + 0.01 per prompt character; holds a call with the prompt 'slow' at `gate`
    until the test opens it; raises on 'boom'.

    With `log` (a file path) it appends each call's batch size there, so the test process
    reads the batch sizes of the copy that runs in a replica.
    """

    name = "brightness"

    def __init__(self, gate: FileGate | None = None, log: str | None = None):
        self.gate, self.log = gate, log

    @property
    def batch_sizes(self) -> list[int]:
        if self.log is None or not Path(self.log).exists():
            return []
        return [int(line) for line in Path(self.log).read_text().split()]

    def _record(self, n: int) -> None:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{n}\n")

    def _score(self, images, prompts):
        if "slow" in prompts:
            assert self.gate is not None, "the prompt 'slow' needs a Brightness with a gate"
            self.gate.pass_through()
        if "boom" in prompts:
            raise RuntimeError("kaboom")
        return images.mean(dim=(1, 2, 3)) + torch.tensor([0.01 * len(p) for p in prompts])

    def __call__(self, images, prompts):
        self._record(images.shape[0])
        return score_media(self._score, images, prompts)


def quantized(images):  # what the reward sees through the uint8 wire
    return (images.clamp(0, 1) * 255).round() / 255


def post(server, body: bytes, path="/score", headers=None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw)
        except json.JSONDecodeError:  # Serve's own 503 is text
            return resp.status, {"text": raw.decode()}
    finally:
        conn.close()


def send_all(server, requests) -> tuple[list, list[threading.Thread]]:
    """POST each (images, prompts) from its own thread; returns (results, started threads).

    results[i] is (status, json) once request i is answered, None before."""
    results = [None] * len(requests)

    def send(i, images, prompts):
        results[i] = post(server, encode_request(images, prompts))

    threads = [threading.Thread(target=send, args=(i, *r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    return results, threads


def join(threads) -> None:
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a request got no answer within 60 s"


def health_shows(client, **want) -> bool:
    h = client.health()
    return all(h[k] == v for k, v in want.items())


def assert_still_serving(server, client, n: int = 2):
    """/health answers, the replica goes idle, and n samples are scored right (n = max_batch
    for a server whose batches wait LONG_WAIT_S: a full batch does not wait)."""
    assert client.health()["status"] == "ok"
    # a call held at a gate opened last may still be running
    wait_until(lambda: health_shows(client, busy=False, queued=0), "the replica to be idle (busy False, queued 0)")
    x, prompts = torch.rand(n, 3, 8, 8), ["ok", "fine", "good"] * n
    torch.testing.assert_close(client(x, prompts[:n]), Brightness()(quantized(x), prompts[:n]))


@pytest.fixture(scope="module")
def serve_cluster():
    """A 2-CPU local Ray cluster with Serve's HTTP proxy on a free port, shared by the module."""
    if ray.is_initialized():  # another module's cluster: this one needs its own, sized and empty
        ray.shutdown()
    saved = {key: os.environ.get(key) for key in SERVE_ENV}
    os.environ.update(SERVE_ENV)
    try:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
        serve.shutdown()
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


@pytest.fixture(scope="class")
def reward(tmp_path_factory):
    return Brightness(log=str(tmp_path_factory.mktemp("server") / "batch_sizes.txt"))


@pytest.fixture(scope="class")
def server(serve_cluster, reward):
    with RewardServer(reward, port=0, replicas=1, max_batch=8, max_request_mb=0.05, timeout_s=10) as s:
        yield s


@pytest.fixture
def client(server):
    return RemoteReward(server.url, "brightness", timeout_s=20, retries=2, backoff=0.05)


def test_codec_roundtrip():
    x = torch.rand(3, 2, 3, 5, 4)  # a video batch
    images, prompts, name = decode_request(encode_request(x, ["a", "b", "c"], reward="r"))
    assert (prompts, name) == (["a", "b", "c"], "r")
    torch.testing.assert_close(images, quantized(x))
    images, _, _ = decode_request(encode_request(x, ["a", "b", "c"], wire_dtype="float32"))
    assert torch.equal(images, x)


class TestOneServer:
    """Tests that share one deployment (`server`, class-scoped: a deployment is a replica process
    that imports torch, seconds of CPU); each leaves it serving, and reads only the batch
    sizes logged after it began."""

    def test_good_request_matches_local(self, server, client, reward):
        before = len(reward.batch_sizes)  # the calls of the class's tests before this one
        x = torch.rand(4, 3, 16, 16)
        torch.testing.assert_close(client(x, PROMPTS), Brightness()(quantized(x), PROMPTS))
        video = torch.rand(2, 3, 3, 8, 8)
        torch.testing.assert_close(client(video, PROMPTS[:2]), Brightness()(quantized(video), PROMPTS[:2]))
        assert client.health()["reward"] == "brightness"
        # larger than max_batch (8): scored in chunks, same numbers
        big = torch.rand(12, 3, 4, 4)
        torch.testing.assert_close(client(big, ["p"] * 12), Brightness()(quantized(big), ["p"] * 12))
        assert max(reward.batch_sizes[before:]) == 8  # max_batch: no reward call held more

    def test_malformed_requests_get_400(self, server, client):
        status, err = post(server, b"definitely not safetensors")
        assert status == 400 and err["error"] == "malformed_request" and "safetensors" in err["message"]
        status, err = post(server, save({"images": torch.zeros(1, 3, 4, 4, dtype=torch.uint8)}))
        assert status == 400 and "'prompts'" in err["message"]
        body = save({"images": torch.zeros(2, 3, 4, 4, dtype=torch.uint8)}, metadata={"prompts": json.dumps(["one"])})
        status, err = post(server, body)
        assert status == 400 and "2 samples but 1 prompts" in err["message"]
        body = save({"pixels": torch.zeros(1, 3, 4, 4, dtype=torch.uint8)}, metadata={"prompts": '["a"]'})
        status, err = post(server, body)
        assert status == 400 and "'images'" in err["message"]
        body = save({"images": torch.zeros(1, 3, 4, 4, dtype=torch.int32)}, metadata={"prompts": '["a"]'})
        assert post(server, body)[0] == 400
        body = save({"images": torch.full((1, 3, 4, 4), 2.0)}, metadata={"prompts": '["a"]'})
        assert post(server, body)[0] == 400  # floats outside [0, 1]
        assert post(server, b"", path="/nope")[0] == 404
        # the wrong reward: fails at once (4xx is not retried), naming both
        with pytest.raises(RemoteRewardError, match="serves reward 'brightness'.*asked for 'pickscore'") as info:
            RemoteReward(server.url, "pickscore", retries=5, backoff=10)(torch.rand(1, 3, 4, 4), ["a"])
        assert info.value.status == 400
        assert_still_serving(server, client)

    def test_missing_content_length_gets_411(self, server, client):
        conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
        conn.putrequest("POST", "/score")
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["message"]
        conn.close()
        assert_still_serving(server, client)

    def test_oversized_request_gets_413(self, server, client):
        big = torch.rand(8, 3, 64, 64)  # 96 KiB of uint8 > 0.05 MiB
        status, err = post(server, encode_request(big, ["p"] * 8))
        assert status == 413 and err["error"] == "request_too_large" and "max_request_mb" in err["message"]
        with pytest.raises(RemoteRewardError, match="max_request_mb") as info:
            client(big, ["p"] * 8)
        assert info.value.status == 413
        assert_still_serving(server, client)

    def test_upload_that_pauses_mid_body_is_scored(self, server, client):
        x = torch.rand(2, 3, 8, 8)
        body = encode_request(x, ["a", "b"])
        sock = _send_half(server, body)
        try:
            # the replica holds half a body and waits for the rest (read_timeout_s 60: far off)
            wait_until(lambda: health_shows(client, uploading=1), "the replica to be receiving the body")
            sock.sendall(body[len(body) // 2 :])
            status, payload = _answer(sock)
        finally:
            sock.close()
        assert status == 200
        torch.testing.assert_close(torch.tensor(payload["scores"]), Brightness()(quantized(x), ["a", "b"]))
        assert_still_serving(server, client)


@pytest.mark.slow  # a model reward over the wire; the default tier sends the toy one (TestOneServer)
def test_tiny_clip_over_the_wire(serve_cluster, tiny_clip_dir):
    reward = ClipScore(tiny_clip_dir)
    x = torch.rand(3, 3, 32, 32)
    with RewardServer(reward, port=0, replicas=1, timeout_s=30) as s:
        remote = RemoteReward(s.url, "clip-score", retries=0)
        torch.testing.assert_close(remote(x, PROMPTS[:3]), reward(quantized(x), PROMPTS[:3]), atol=1e-6, rtol=1e-6)


def test_concurrent_requests_are_batched(serve_cluster, tmp_path):
    # Requests that arrive while the reward is busy queue, then share one call: 4 x 2 samples
    # fill max_batch (8), so that call holds all four whatever order they arrive in.
    gate = FileGate(tmp_path / "gate")
    reward = Brightness(gate, log=str(tmp_path / "batch_sizes.txt"))
    with RewardServer(reward, port=0, replicas=1, reward_on="thread", max_batch=8, batch_wait_s=LONG_WAIT_S, timeout_s=60) as s:
        client = RemoteReward(s.url, "brightness", retries=0)
        held, held_threads = send_all(s, [(torch.rand(8, 3, 8, 8), ["slow"] + ["s"] * 7)])  # full: runs at once
        gate.wait_inside(1)
        xs = [torch.rand(2, 3, 8, 8) for _ in range(4)]
        results, threads = send_all(s, [(x, ["a", "bb"]) for x in xs])
        wait_until(lambda: health_shows(client, busy=True, queued=4), "4 requests queued behind the held call")
        gate.open()
        join(held_threads + threads)
        assert held[0][0] == 200
        for x, (status, payload) in zip(xs, results):
            assert status == 200
            torch.testing.assert_close(torch.tensor(payload["scores"]), Brightness()(quantized(x), ["a", "bb"]))
        assert reward.batch_sizes == [8, 8]  # the held call, then the four queued requests in one call
        assert_still_serving(s, client, n=8)


@pytest.fixture(scope="class")
def batches_of_3(serve_cluster, tmp_path_factory):
    """A server whose batches hold 3 samples and wait LONG_WAIT_S to fill, and its reward."""
    reward = Brightness(log=str(tmp_path_factory.mktemp("batches_of_3") / "batch_sizes.txt"))
    with RewardServer(reward, port=0, replicas=1, max_batch=3, batch_wait_s=LONG_WAIT_S, timeout_s=60) as s:
        yield s, reward


class TestBatchesOf3:
    """Tests that share one deployment whose batches hold 3 samples (`batches_of_3`)."""

    def test_reward_exception_gets_500_and_spares_batchmates(self, batches_of_3):
        # max_batch 3 = the two requests' samples: they share a call whatever order they arrive in
        s, reward = batches_of_3
        before = len(reward.batch_sizes)  # the calls of the class's tests before this one
        client = RemoteReward(s.url, "brightness", retries=2, backoff=0.05)
        x = torch.rand(2, 3, 8, 8)
        results, threads = send_all(s, [(torch.rand(1, 3, 8, 8), ["boom"]), (x, ["a", "b"])])
        join(threads)
        (bad_status, bad), (good_status, good) = results
        assert bad_status == 500 and bad["error"] == "reward_failed" and "RuntimeError: kaboom" in bad["message"]
        assert good_status == 200
        # they were batched (3); the failed call was then re-run request by request (1 and 2)
        sizes = reward.batch_sizes[before:]
        assert sizes[0] == 3 and sorted(sizes[1:]) == [1, 2], sizes
        torch.testing.assert_close(torch.tensor(good["scores"]), Brightness()(quantized(x), ["a", "b"]))
        assert_still_serving(s, client, n=3)

    def test_batch_wait_gathers_requests_sent_apart(self, batches_of_3):
        # max_batch 3 = both requests' samples: the batch closes when the second one joins it
        s, reward = batches_of_3
        before = len(reward.batch_sizes)
        client = RemoteReward(s.url, "brightness", retries=0)
        xs = [torch.rand(1, 3, 8, 8), torch.rand(2, 3, 8, 8)]
        first, threads = send_all(s, [(xs[0], ["p"])])
        wait_until(lambda: health_shows(client, queued=1), "the first request to wait in its batch")
        second, more = send_all(s, [(xs[1], ["p", "p"])])  # sent after the first is already waiting
        join(threads + more)
        for x, (status, payload) in zip(xs, first + second):
            assert status == 200
            torch.testing.assert_close(torch.tensor(payload["scores"]), Brightness()(quantized(x), ["p"] * len(x)))
        assert reward.batch_sizes[before:] == [3]  # one reward call for both


@pytest.mark.slow  # a Serve app of its own (seconds to deploy); the default tier keeps the 4xx answers (TestOneServer)
def test_slow_reward_gets_504_and_client_gives_up_clearly(serve_cluster, tmp_path):
    # The gate stays closed until every 504 is in: the reward is slow for certain. timeout_s 1
    # leaves the good request at the end room to be scored on a loaded machine.
    gate = FileGate(tmp_path / "gate")
    with RewardServer(Brightness(gate), port=0, replicas=1, reward_on="thread", timeout_s=1.0) as s:
        status, err = post(s, encode_request(torch.rand(1, 3, 4, 4), ["slow"]))
        assert status == 504 and err["error"] == "timeout" and "within 1.0 s" in err["message"]
        waits = []
        client = RemoteReward(s.url, "brightness", timeout_s=10, retries=1, backoff=0.05, sleep=waits.append)
        with pytest.raises(RemoteRewardError, match=r"failed after 2 attempts; last error: HTTP 504") as info:
            client(torch.rand(1, 3, 4, 4), ["slow"])
        # the server's 504 ended both attempts (not the client's 10 s socket timeout), one backoff apart
        assert info.value.status == 504 and waits == [0.05]
        assert not gate.is_open()
        gate.open()
        assert_still_serving(s, client)


def test_unreachable_server_raises_after_retries():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = RemoteReward(url, "brightness", timeout_s=2, retries=2, backoff=0.01)
    with pytest.raises(RemoteRewardError, match="failed after 3 attempts; last error: ConnectionRefusedError"):
        client(torch.rand(1, 3, 4, 4), ["a"])


class CrashesOnce(Brightness):
    """Brightness whose first call raises, like a reward process that dies once and comes back."""

    def __call__(self, images, prompts):
        if not self.batch_sizes:
            self._record(0)
            raise RuntimeError("crashed")
        return super().__call__(images, prompts)


@pytest.mark.slow  # a Serve app of its own; the client's retry after a 503 stays in the default tier (back-pressure)
def test_remote_reward_from_config_recovers_from_a_crash(serve_cluster, tmp_path):
    # The runtime's path to a served reward: reward.paths.remote=URL#name -> build_reward ->
    # RemoteReward. Its first request gets a 500 and is retried; every batch is still scored.
    reward = CrashesOnce(log=str(tmp_path / "batch_sizes.txt"))
    with RewardServer(reward, port=0, replicas=1, timeout_s=10) as s:
        remote = build_reward("remote", {"remote": f"{s.url}#brightness"})
        assert isinstance(remote, RemoteReward) and remote.name == "brightness"
        for x, p in [(torch.rand(3, 3, 8, 8), ["a", "bb", "ccc"]), (torch.rand(2, 4, 3, 8, 8), ["video", "v"])]:
            torch.testing.assert_close(remote(x, p), Brightness()(quantized(x), p))
        assert reward.batch_sizes == [0, 3, 2]  # the crashed call, then one call per batch
        assert s.health()["served"] == 2


def test_reward_spec_errors_are_clear():
    from digenrl.rewards.specs import resolve_reward

    with pytest.raises(ValueError, match="unknown reward 'nope'.*pickscore"):
        resolve_reward("nope")
    reward = Brightness()
    assert resolve_reward(reward) is reward
    with pytest.raises(TypeError, match="did not give a Reward"):
        resolve_reward("builtins:dict?a=1")


def _send_half(server, body: bytes) -> socket.socket:
    """Open POST /score with the whole body's Content-Length and send only its first half."""
    sock = socket.create_connection((server.host, server.port), timeout=60)
    head = f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    sock.sendall(head.encode() + body[: len(body) // 2])
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict]:
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, json.loads(resp.read())


@pytest.mark.slow  # a Serve app of its own; the default tier keeps a paused upload that resumes (TestOneServer)
def test_stalled_upload_gets_408(serve_cluster):
    with RewardServer(Brightness(), port=0, replicas=1, read_timeout_s=2.0, timeout_s=10) as s:
        client = RemoteReward(s.url, "brightness", retries=0)
        sock = _send_half(s, encode_request(torch.rand(2, 3, 8, 8), ["a", "b"]))
        try:
            status, err = _answer(sock)  # the rest never comes: the stall is certain, not a sleep's length
        finally:
            sock.close()
        assert status == 408 and err["error"] == "request_timeout" and "read_timeout_s (2.0 s)" in err["message"]
        assert health_shows(client, uploading=0)  # the stalled upload no longer holds the replica
        assert_still_serving(s, client)


# the 503's body: Serve's proxy answers text naming back-pressure; the replica's listener, JSON
REFUSAL_TEXT = {"proxy": "backpressure", "replica": "max_ongoing 1 + max_queued 1"}


@pytest.mark.parametrize("ingress", ["replica", pytest.param("proxy", marks=pytest.mark.slow)])
def test_back_pressure_gets_503_and_the_client_retries(serve_cluster, tmp_path, ingress):
    # One request held by the replica (max_ongoing 1) and one queued (max_queued 1; "proxy": at the
    # proxy, "replica": the listener's second connection): while the gate is closed, every other
    # request is refused with 503.
    gate = FileGate(tmp_path / "gate")
    with RewardServer(Brightness(gate), port=0, replicas=1, reward_on="thread", max_ongoing=1, max_queued=1, timeout_s=60, ingress=ingress) as s:
        held, held_threads = send_all(s, [(torch.rand(1, 3, 8, 8), ["slow"])])
        gate.wait_inside(1)  # the replica's one slot is taken until the gate opens
        results, threads = send_all(s, [(torch.rand(1, 3, 8, 8), ["a"]) for _ in range(4)])
        wait_until(lambda: sum(r is not None for r in results) >= 3, "3 of 4 requests answered while the replica is held")
        refused = [r for r in results if r is not None]
        assert [status for status, _ in refused] == [503, 503, 503], refused
        assert all(REFUSAL_TEXT[ingress] in p.get("text", p.get("message")) for _, p in refused), refused
        # The client meets the same full queue (503), backs off, and its retry is scored: its
        # backoff opens the gate and returns once the held and the queued request are answered.
        waits = []

        def backoff(seconds: float) -> None:
            waits.append(seconds)
            gate.open()
            join(held_threads + threads)

        client = RemoteReward(s.url, "brightness", retries=6, backoff=0.2, sleep=backoff)
        x = torch.rand(1, 3, 8, 8)
        torch.testing.assert_close(client(x, ["c"]), Brightness()(quantized(x), ["c"]))
        assert waits == [0.2]  # one 503, then scored
        assert held[0][0] == 200 and [r[0] for r in results].count(200) == 1  # the queued request was scored
        assert_still_serving(s, client)


def test_replicas_each_score_and_answer(serve_cluster):
    with RewardServer(Brightness(), port=0) as s:  # replicas 0 (auto): one per CPU of the 2 the cluster has
        assert s.options.replicas == 2
        seen = {s.health()["replica"] for _ in range(60)}
        assert len(seen) == 2  # Serve spreads requests over both (all on one: p = 2**-59)
        client = RemoteReward(s.url, "brightness", retries=0)
        xs = [torch.rand(3, 3, 8, 8) for _ in range(8)]
        outs = [None] * len(xs)
        threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, client(xs[i], ["a", "b", "c"])))
                   for i in range(len(xs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, Brightness()(quantized(x), ["a", "b", "c"]))


def test_unplaceable_replicas_and_a_second_port_are_refused(serve_cluster):
    with pytest.raises(ValueError, match=r"1 replicas x 1 GPU \(--gpus-per-replica\) need 1 GPUs; the Ray cluster has 0"):
        RewardServer(Brightness(), port=0, gpus_per_replica=1).start()
    with pytest.raises(ValueError, match=r"3 replicas x 1 CPU \(--cpus-per-replica\) need 3 CPUs; the Ray cluster has 2"):
        RewardServer(Brightness(), port=0, replicas=3).start()
    with pytest.raises(ValueError, match=f"already runs on this cluster with its HTTP proxy at 127.0.0.1:{serve_cluster}"):
        RewardServer(Brightness(), port=serve_cluster + 1 if serve_cluster < 65535 else 1, ingress="proxy").start()
    with pytest.raises(ValueError, match=f"Serve's HTTP proxy already listens at port {serve_cluster} on this cluster"):
        RewardServer(Brightness(), port=serve_cluster).start()  # the replicas cannot share the proxy's port
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        RewardServer("nope", port=0).start()
    assert serve.status().applications == {}  # nothing was deployed


@pytest.mark.slow  # Serve retries the constructor, each try a replica process
def test_a_reward_that_cannot_load_fails_start(serve_cluster, tmp_path):
    calls = tmp_path / "constructor_calls.txt"
    with pytest.raises(RuntimeError, match="(?s)the reward server did not start: .*did not give a Reward"):
        RewardServer(f"tests.serving.helpers:counted_non_reward?log={calls}", port=0, replicas=1).start()
    tries = len(calls.read_text().split())
    assert 1 <= tries <= 3, f"{tries} constructor tries: a few (max_constructor_retry_count), not Serve's default 20"
    assert serve.status().applications == {}  # start() deleted the failed app

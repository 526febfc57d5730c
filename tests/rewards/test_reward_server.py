"""The reward service over loopback: a server in a thread on an ephemeral port.

Every test ends by checking the server still answers /health and a good request.
"""

import http.client
import json
import threading
import time

import pytest
import torch
from safetensors.torch import save

from digenrl.rewards import build_reward
from digenrl.rewards.base import score_media
from digenrl.rewards.client import RemoteReward, RemoteRewardError
from digenrl.rewards.clip_models import ClipScore
from digenrl.rewards.server import RewardServer
from digenrl.rewards.wire import decode_request, encode_request

pytestmark = pytest.mark.timeout(60)

PROMPTS = ["a red cat", "a dog on grass", "a red cat", "text saying 42"]


class Brightness:
    """Mean pixel + 0.01 per prompt character; records batch sizes; sleeps on the prompt 'slow'."""

    name = "brightness"

    def __init__(self, slow_s: float = 0.0):
        self.slow_s, self.batch_sizes = slow_s, []

    def _score(self, images, prompts):
        if "slow" in prompts:
            time.sleep(self.slow_s)
        if "boom" in prompts:
            raise RuntimeError("kaboom")
        return images.mean(dim=(1, 2, 3)) + torch.tensor([0.01 * len(p) for p in prompts])

    def __call__(self, images, prompts):
        self.batch_sizes.append(images.shape[0])
        return score_media(self._score, images, prompts)


def quantized(images):  # what the reward sees through the uint8 wire
    return (images.clamp(0, 1) * 255).round() / 255


def post(server, body: bytes, path="/score", headers=None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def assert_still_serving(server, client):
    assert client.health()["status"] == "ok"
    deadline = time.monotonic() + 10
    while client.health()["busy"] or client.health()["queued"]:  # a slow call may still be running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    x = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(client(x, ["ok", "fine"]), server.reward(quantized(x), ["ok", "fine"]))


@pytest.fixture
def server():
    with RewardServer(Brightness(), max_batch=8, max_request_mb=0.05, timeout_s=10) as s:
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


def test_good_request_matches_local(server, client):
    x = torch.rand(4, 3, 16, 16)
    torch.testing.assert_close(client(x, PROMPTS), server.reward(quantized(x), PROMPTS))
    video = torch.rand(2, 3, 3, 8, 8)
    torch.testing.assert_close(client(video, PROMPTS[:2]), server.reward(quantized(video), PROMPTS[:2]))
    assert client.health()["reward"] == "brightness"
    # larger than max_batch (8): scored in chunks, same numbers
    big = torch.rand(12, 3, 4, 4)
    torch.testing.assert_close(client(big, ["p"] * 12), server.reward(quantized(big), ["p"] * 12))


def test_tiny_clip_over_the_wire(tiny_clip_dir):
    reward = ClipScore(tiny_clip_dir)
    x = torch.rand(3, 3, 32, 32)
    with RewardServer(reward, timeout_s=30) as s:
        remote = RemoteReward(s.url, "clip-score", retries=0)
        torch.testing.assert_close(remote(x, PROMPTS[:3]), reward(quantized(x), PROMPTS[:3]), atol=1e-6, rtol=1e-6)


def _while_busy(server, requests):
    """Occupy the scorer with a slow call, then send `requests` [(images, prompts)] concurrently.

    They queue behind the slow call and reach the scorer together. Returns [(status, json)].
    """
    results = [None] * (len(requests) + 1)

    def send(i, images, prompts):
        results[i] = post(server, encode_request(images, prompts))

    slow = threading.Thread(target=send, args=(0, torch.rand(1, 3, 8, 8), ["slow"]))
    slow.start()
    time.sleep(0.1)
    threads = [threading.Thread(target=send, args=(i + 1, *r)) for i, r in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads + [slow]:
        t.join()
    return results[1:]


def test_concurrent_requests_are_batched():
    reward = Brightness(slow_s=0.5)
    with RewardServer(reward, max_batch=64, timeout_s=10) as s:
        xs = [torch.rand(2, 3, 8, 8) for _ in range(4)]
        results = _while_busy(s, [(x, ["a", "bb"]) for x in xs])
        for x, (status, payload) in zip(xs, results):
            assert status == 200
            torch.testing.assert_close(torch.tensor(payload["scores"]), reward(quantized(x), ["a", "bb"]))
        assert reward.batch_sizes[0] == 1 and max(reward.batch_sizes[1:]) >= 4  # >= two requests in one call


def test_reward_exception_gets_500_and_spares_batchmates(server, client):
    server.reward.slow_s = 0.5
    x = torch.rand(2, 3, 8, 8)
    (bad_status, bad), (good_status, good) = _while_busy(server, [(torch.rand(1, 3, 8, 8), ["boom"]), (x, ["a", "b"])])
    assert bad_status == 500 and bad["error"] == "reward_failed" and "RuntimeError: kaboom" in bad["message"]
    assert good_status == 200
    assert 3 in server.reward.batch_sizes  # they were batched; the failure was then isolated
    torch.testing.assert_close(torch.tensor(good["scores"]), server.reward(quantized(x), ["a", "b"]))
    assert_still_serving(server, client)


def test_malformed_requests_get_400(server, client):
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


def test_missing_content_length_gets_411(server, client):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.putrequest("POST", "/score")
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["message"]
    conn.close()
    assert_still_serving(server, client)


def test_oversized_request_gets_413(server, client):
    big = torch.rand(8, 3, 64, 64)  # 96 KiB of uint8 > 0.05 MiB
    status, err = post(server, encode_request(big, ["p"] * 8))
    assert status == 413 and err["error"] == "request_too_large" and "max_request_mb" in err["message"]
    with pytest.raises(RemoteRewardError, match="max_request_mb") as info:
        client(big, ["p"] * 8)
    assert info.value.status == 413
    assert_still_serving(server, client)


def test_slow_reward_gets_504_and_client_gives_up_clearly():
    reward = Brightness(slow_s=1.5)
    with RewardServer(reward, timeout_s=0.4) as s:
        status, err = post(s, encode_request(torch.rand(1, 3, 4, 4), ["slow"]))
        assert status == 504 and err["error"] == "timeout" and "0.4 s" in err["message"]
        client = RemoteReward(s.url, "brightness", timeout_s=10, retries=1, backoff=0.05)
        start = time.monotonic()
        with pytest.raises(RemoteRewardError, match=r"failed after 2 attempts; last error: HTTP 504") as info:
            client(torch.rand(1, 3, 4, 4), ["slow"])
        assert info.value.status == 504 and time.monotonic() - start < 5
        assert_still_serving(s, client)


def test_unreachable_server_raises_after_retries():
    with RewardServer(Brightness()) as s:
        url = s.url
    client = RemoteReward(url, "brightness", timeout_s=2, retries=2, backoff=0.01)
    with pytest.raises(RemoteRewardError, match="failed after 3 attempts; last error: ConnectionRefusedError"):
        client(torch.rand(1, 3, 4, 4), ["a"])


class CrashesOnce(Brightness):
    """Brightness whose first call raises, like a reward process that dies once and comes back."""

    def __call__(self, images, prompts):
        if not self.batch_sizes:
            self.batch_sizes.append(0)
            raise RuntimeError("crashed")
        return super().__call__(images, prompts)


def test_remote_reward_from_config_recovers_from_a_crash():
    # The runtime's path to a served reward: reward.paths.remote=URL#name -> build_reward ->
    # RemoteReward. Its first request gets a 500 and is retried; every batch is still scored.
    reward = CrashesOnce()
    with RewardServer(reward, timeout_s=10) as s:
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

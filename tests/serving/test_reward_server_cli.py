"""`digenrl reward-server`: every flag reaches its ServeOptions field or is refused with a
message naming it; --address picks the cluster; the real command serves, then stops on Ctrl-C."""

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from digenrl.cli import build_parser, main, serve_options
from digenrl.rewards.client import RemoteReward
from digenrl.rewards.toy import JpegCompressibility
from digenrl.rewards.wire import encode_request

pytest.importorskip("ray.serve")
from digenrl.runtime.serving import reward_server  # noqa: E402 - needs ray[serve]
from digenrl.runtime.serving.options import ServeOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = "digenrl.rewards.toy:JpegCompressibility"

# every ServeOptions field, its flag, and a value that is not the default
NON_DEFAULT = {
    "host": "0.0.0.0", "port": 9123, "replicas": 3, "max_batch": 16, "batch_wait_s": 0.05,
    "max_request_mb": 8.0, "timeout_s": 30.0, "read_timeout_s": 5.0, "max_ongoing": 32, "max_queued": -1,
    "cpus_per_replica": 0.5, "gpus_per_replica": 1.0,
}


def test_every_flag_reaches_its_option():
    assert set(NON_DEFAULT) == {f.name for f in fields(ServeOptions)}
    argv = ["reward-server", SPEC, "--address", "auto"]
    for key, value in NON_DEFAULT.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    args = build_parser().parse_args(argv)
    assert (args.reward, args.address) == (SPEC, "auto")
    assert serve_options(args) == ServeOptions(**NON_DEFAULT)
    assert serve_options(build_parser().parse_args(["reward-server", SPEC])) == ServeOptions()  # same defaults


@pytest.mark.parametrize("flag, value, message", [
    ("--port", "70000", "port must be in 0..65535"),
    ("--replicas", "0", "replicas must be an integer >= 1"),
    ("--max-batch", "0", "max_batch must be an integer >= 1"),
    ("--max-ongoing", "0", "max_ongoing must be an integer >= 1"),
    ("--max-queued", "0", "max_queued must be an integer >= 1, or -1 for no limit"),
    ("--max-request-mb", "0", "max_request_mb must be > 0"),
    ("--timeout-s", "0", "timeout_s must be > 0"),
    ("--read-timeout-s", "-1", "read_timeout_s must be > 0"),
    ("--batch-wait-s", "-0.1", "batch_wait_s must be >= 0"),
    ("--cpus-per-replica", "-1", "cpus_per_replica must be >= 0"),
    ("--gpus-per-replica", "-1", "gpus_per_replica must be >= 0"),
])
def test_bad_values_are_refused_naming_the_option(flag, value, message, capsys):
    assert main(["reward-server", SPEC, flag, value]) == 2
    assert f"reward server option {message}" in capsys.readouterr().err


def test_address_picks_the_cluster(monkeypatch):
    calls = []
    monkeypatch.setattr(reward_server.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(reward_server.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert reward_server._connect("10.0.0.5:6379", ServeOptions()) is False  # joined, not ours to stop
    assert calls[-1]["address"] == "10.0.0.5:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.6:6379")
    assert reward_server._connect(None, ServeOptions()) is False
    assert calls[-1]["address"] == "10.0.0.6:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    # no address: a new local cluster (never whatever another process runs), sized for the replicas
    assert reward_server._connect(None, ServeOptions(replicas=64, cpus_per_replica=0.5)) is True
    assert calls[-1]["address"] == "local" and calls[-1]["num_cpus"] == max(os.cpu_count(), 32)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


# slow tier: it starts its own Ray cluster and Serve (14 s alone); in one full default-tier run on
# 2 cores it did not exit within 120 s of Ctrl-C (not reproduced alone; open, see docs/runtime.md)
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_command_serves_then_stops_on_ctrl_c(tmp_path):
    port = _free_port()
    argv = [sys.executable, "-m", "digenrl.cli", "reward-server", SPEC, "--port", str(port), "--replicas", "2",
            "--cpus-per-replica", "0.5", "--max-batch", "4", "--max-request-mb", "0.25", "--timeout-s", "30"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, lines = f"http://127.0.0.1:{port}", []
        # the proxy answers once one replica is up; the command prints its line once all are
        while not any("serving reward" in line for line in lines):
            lines.append(proc.stdout.readline())
            assert proc.poll() is None, "".join(lines) + proc.stdout.read()
        assert f"serving reward 'jpeg-compressibility' at {url} with 2 replica(s)" in lines[-1]
        health = _get(f"{url}/health")
        reward = JpegCompressibility()
        assert (health["reward"], health["max_batch"], health["timeout_s"]) == (reward.name, 4, 30.0)
        assert health["max_request_bytes"] == 2**18
        assert len({_get(f"{url}/health")["replica"] for _ in range(40)}) == 2  # --replicas 2
        x = torch.rand(10, 3, 16, 16)  # > max_batch: scored in chunks of 4
        prompts = ["p"] * 10
        client = RemoteReward(url, reward.name, retries=0)
        torch.testing.assert_close(client(x, prompts), reward((x * 255).round() / 255, prompts))
        big = encode_request(torch.rand(30, 3, 64, 64), ["p"] * 30)  # 360 KiB > 0.25 MiB
        req = urllib.request.Request(f"{url}/score", data=big, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 413
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        with pytest.raises(OSError):  # Serve and its local cluster are gone
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

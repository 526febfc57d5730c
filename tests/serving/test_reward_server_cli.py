"""`digenrl reward-server`: every flag reaches its ServeOptions field or is refused with a
message naming it; --address picks the cluster; the real command serves, then exits cleanly
on Ctrl-C, giving requests in flight a bounded grace. How fast it exits (within 10 s) is a
wall-clock figure: the `timing` tier checks it; the slow tier only bounds a hang."""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from digenrl.tools.cli import build_parser, main, serve_options
from digenrl.rewards.client import RemoteReward
from digenrl.rewards.toy import JpegCompressibility
from digenrl.rewards.wire import encode_request

pytest.importorskip("ray.serve")
from digenrl.runtime.serving import reward_server  # noqa: E402 - needs ray[serve]
from digenrl.runtime.serving.options import AUTO_REPLICAS_MAX, ServeOptions  # noqa: E402
from tests.helpers.gates import FileGate, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = "digenrl.rewards.toy:JpegCompressibility"

# every ServeOptions field, its flag, and a value that is not the default
NON_DEFAULT = {
    "host": "0.0.0.0", "port": 9123, "ingress": "proxy", "replicas": 3, "max_batch": 16, "batch_wait_s": 0.05,
    "max_request_mb": 8.0, "timeout_s": 30.0, "read_timeout_s": 5.0, "max_ongoing": 32, "max_queued": -1,
    "cpus_per_replica": 0.5, "gpus_per_replica": 1.0, "shutdown_grace_s": 7.5, "reward_on": "thread",
    "token_file": "/run/secrets/reward-token", "tls_cert": "/etc/tls/tls.crt", "tls_key": "/etc/tls/tls.key",
}
EXIT_LIMIT_S = 10.0  # issue 29: `digenrl reward-server` exits within 10 s of Ctrl-C (timing tier)
# The slow tier's bound: a command that hangs fails, one slowed by a loaded machine does not
# (CI saw it take over 10 s to act on SIGINT with 5-11 processes per core).
HANG_LIMIT_S = 120.0
# each test runs in the slow tier with the hang bound, and in the timing tier with the 10 s one
EXIT_LIMITS = [pytest.param(HANG_LIMIT_S, marks=pytest.mark.slow, id="exits"),
               pytest.param(EXIT_LIMIT_S, marks=pytest.mark.timing, id="within-10s")]


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
    ("--ingress", "haproxy", "ingress must be one of replica, proxy"),
    ("--replicas", "-1", "replicas must be an integer >= 1, or 0 for auto"),
    ("--reward-on", "gpu", "reward_on must be one of auto, loop, thread"),
    ("--max-batch", "0", "max_batch must be an integer >= 1"),
    ("--max-ongoing", "0", "max_ongoing must be an integer >= 1"),
    ("--max-queued", "0", "max_queued must be an integer >= 1, or -1 for no limit"),
    ("--max-request-mb", "0", "max_request_mb must be > 0"),
    ("--timeout-s", "0", "timeout_s must be > 0"),
    ("--read-timeout-s", "-1", "read_timeout_s must be > 0"),
    ("--batch-wait-s", "-0.1", "batch_wait_s must be >= 0"),
    ("--cpus-per-replica", "-1", "cpus_per_replica must be >= 0"),
    ("--gpus-per-replica", "-1", "gpus_per_replica must be >= 0"),
    ("--shutdown-grace-s", "-1", "shutdown_grace_s must be >= 0"),
    ("--tls-cert", "/etc/tls/tls.crt", "tls_key must be given with tls_cert (--tls-cert)"),
    ("--tls-key", "/etc/tls/tls.key", "tls_cert must be given with tls_key (--tls-key)"),
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


def test_auto_replicas_one_per_cpu_capped_by_the_cluster():
    from digenrl.runtime.serving.reward_server import auto_replicas

    assert auto_replicas(ServeOptions(), 2, {"CPU": 2.0}) == 2  # this machine: 2 CPUs, 2 replicas
    assert auto_replicas(ServeOptions(), 64, {"CPU": 64.0}) == AUTO_REPLICAS_MAX
    assert auto_replicas(ServeOptions(), 8, {"CPU": 3.0}) == 3  # what the cluster holds at 1 CPU each
    assert auto_replicas(ServeOptions(cpus_per_replica=0.5), 8, {"CPU": 1.0}) == 2
    assert auto_replicas(ServeOptions(cpus_per_replica=0), 3, {}) == 3  # no CPUs reserved: no cluster bound
    assert auto_replicas(ServeOptions(gpus_per_replica=1), 8, {"CPU": 8.0, "GPU": 2.0}) == 2
    # too small a cluster: 1, which the resource check then refuses with its message
    assert auto_replicas(ServeOptions(gpus_per_replica=1), 8, {"CPU": 8.0}) == 1


def test_reward_on_auto_is_a_thread_only_with_gpus():
    assert not ServeOptions().reward_in_thread and not ServeOptions(reward_on="loop", gpus_per_replica=1).reward_in_thread
    assert ServeOptions(gpus_per_replica=0.5).reward_in_thread and ServeOptions(reward_on="thread").reward_in_thread


class _StuckServer:
    """Stands in for a RewardServer whose stop() hangs in a named step until released."""

    def __init__(self):
        self.stopping, self.release = "", threading.Event()

    def stop(self):
        self.stopping = "shutting Serve down"
        assert self.release.wait(timeout=60), "stop_within never gave up on the stuck stop()"


def test_a_stop_that_overruns_is_named_and_the_process_exits(capsys):
    server, codes = _StuckServer(), []

    def exit_process(code):  # stands in for os._exit; lets the stuck stop() return
        codes.append(code)
        server.release.set()

    reward_server.stop_within(server, 0.05, exit_process=exit_process)
    assert codes == [1]
    assert "stopping took over 0.05 s, still shutting Serve down; exiting" in capsys.readouterr().err
    done = _StuckServer()
    done.release.set()  # a stop() that finishes: no exit, no message
    reward_server.stop_within(done, 60, exit_process=codes.append)
    assert codes == [1] and capsys.readouterr().err == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


class Command:
    """`digenrl reward-server SPEC ARGS` in its own process group (as a terminal runs it), its
    output collected line by line in a thread so the test can wait on a line."""

    def __init__(self, tmp_path, spec: str, *args: str, sigint: str = "SIG_DFL"):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "digenrl.tools.cli", "reward-server", spec, "--port", str(self.port), *args]
        # Started as a terminal starts a foreground job: SIGINT at its default (a test run started in
        # the background inherits it ignored, and exec keeps that). sigint="SIG_IGN" starts it as a
        # shell starts `cmd &` or `nohup cmd &`: SIGINT ignored, which the command must override.
        argv = [sys.executable, "-c", f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{sigint}); "
                "os.execv(sys.argv[1], sys.argv[1:])", *command]
        # Serve restarts a proxy not ready within 5 s, failing the start on a loaded machine
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for_line(self, text: str, timeout_s: float = 240) -> str:
        def seen():
            assert self.proc.poll() is None or any(text in line for line in self.lines), \
                f"the command exited ({self.proc.returncode}) before printing {text!r}:\n{self.output}"
            return any(text in line for line in self.lines)

        wait_until(seen, f"the command to print {text!r}; it printed:\n{self.output}", timeout_s)
        return next(line for line in self.lines if text in line)

    def ctrl_c(self) -> float:
        """SIGINT to the command's process group, as Ctrl-C in a terminal; returns when it was sent."""
        sent = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)
        return sent

    def kill_with(self, sig: signal.Signals) -> float:
        """`sig` to the command's process alone, as `kill -TERM PID` does; returns when it was sent."""
        sent = time.monotonic()
        os.kill(self.proc.pid, sig)
        return sent

    def assert_exits_within(self, sent: float, limit_s: float, what: str = "Ctrl-C") -> float:
        """The command exits 0 within limit_s of `sent`; else it is killed and the failure names the
        step it was in (its last line: 'stopping...', a stop() step that overran, or 'stopped in' =
        Python's own exit). Returns the seconds it took."""
        try:
            self.proc.wait(timeout=max(sent + limit_s - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            self.kill()
            last = [line.strip() for line in self.lines if line.strip()][-3:]
            raise AssertionError(f"digenrl reward-server did not exit within {limit_s:g} s of {what}; it was at: "
                                 f"{last}\nfull output:\n{self.output}") from None
        took = time.monotonic() - sent
        self._reader.join(timeout=10)
        assert self.proc.returncode == 0, f"digenrl reward-server exited {self.proc.returncode} after {what}:\n{self.output}"
        assert "stopped in" in self.output, self.output
        with pytest.raises(OSError):  # Serve and its local cluster are gone
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
        return took

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


# slow tier: each starts its own Ray cluster and Serve (15-20 s alone on 2 cores)
@pytest.mark.parametrize("limit_s", EXIT_LIMITS)
@pytest.mark.timeout(400)
def test_the_command_serves_then_stops_on_ctrl_c(tmp_path, limit_s):
    cmd = Command(tmp_path, SPEC, "--replicas", "2", "--cpus-per-replica", "0.5", "--max-batch", "4",
                  "--max-request-mb", "0.25", "--timeout-s", "30")
    try:
        # the proxy answers once one replica is up; the command prints its line once all are
        line = cmd.wait_for_line("serving reward")
        assert f"serving reward 'jpeg-compressibility' at {cmd.url} with 2 replica(s)" in line
        health = _get(f"{cmd.url}/health")
        reward = JpegCompressibility()
        assert (health["reward"], health["max_batch"], health["timeout_s"]) == (reward.name, 4, 30.0)
        assert health["max_request_bytes"] == 2**18
        assert len({_get(f"{cmd.url}/health")["replica"] for _ in range(40)}) == 2  # --replicas 2
        x = torch.rand(10, 3, 16, 16)  # > max_batch: scored in chunks of 4
        prompts = ["p"] * 10
        client = RemoteReward(cmd.url, reward.name, retries=0)
        torch.testing.assert_close(client(x, prompts), reward((x * 255).round() / 255, prompts))
        big = encode_request(torch.rand(30, 3, 64, 64), ["p"] * 30)  # 360 KiB > 0.25 MiB
        req = urllib.request.Request(f"{cmd.url}/score", data=big, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=60)
        assert info.value.code == 413
        took = cmd.assert_exits_within(cmd.ctrl_c(), limit_s)
        print(f"exited {took:.1f} s after Ctrl-C")
    finally:
        cmd.kill()


# A service manager's stop (SIGTERM), and `kill -INT` to a command started with SIGINT ignored
# (`cmd &` from a script, `nohup cmd &`): before, the first ran Ray's own handler (a 30 s node
# drain, then exit 1) and the second did nothing.
@pytest.mark.parametrize("limit_s", EXIT_LIMITS)
@pytest.mark.parametrize("sig, sigint", [(signal.SIGTERM, "SIG_DFL"), (signal.SIGINT, "SIG_IGN")],
                         ids=["sigterm", "sigint-ignored-at-start"])
@pytest.mark.timeout(400)
def test_the_command_stops_on_sigterm_and_on_a_sigint_it_inherited_ignored(tmp_path, sig, sigint, limit_s):
    cmd = Command(tmp_path, SPEC, "--replicas", "1", "--cpus-per-replica", "0.5", sigint=sigint)
    try:
        cmd.wait_for_line("serving reward")
        client = RemoteReward(cmd.url, JpegCompressibility().name, retries=0)
        assert client(torch.rand(2, 3, 16, 16), ["p", "q"]).shape == (2,)
        took = cmd.assert_exits_within(cmd.kill_with(sig), limit_s, what=sig.name)
        assert f"({sig.name})" in cmd.output  # it said which signal stopped it
        print(f"exited {took:.1f} s after {sig.name}")
    finally:
        cmd.kill()


def _post(url: str, images: torch.Tensor, prompts: list[str], out: list) -> None:
    """POST /score; appends (status, json) or the connection error's name to `out`."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", "/score", body=encode_request(images, prompts))
        resp = conn.getresponse()
        raw = resp.read()
        out.append((resp.status, json.loads(raw) if raw.startswith(b"{") else raw.decode()))
    except (OSError, http.client.HTTPException) as e:
        out.append(type(e).__name__)
    finally:
        conn.close()


@pytest.mark.parametrize("limit_s", EXIT_LIMITS)
@pytest.mark.timeout(400)
def test_ctrl_c_gives_requests_in_flight_a_bounded_grace(tmp_path, limit_s):
    # One replica, one sample per reward call. At Ctrl-C, request A is inside the reward and B
    # queued behind it. A's gate opens once the command says it is stopping: A is answered
    # within the grace. B's never opens: at the grace its replica is killed, B gets an error, and
    # the command still exits (within 10 s in the timing tier, grace 3 s). The slow tier gives a
    # 20 s grace: the test opening A's gate after reading the line is not a race a loaded machine
    # can lose.
    grace = 3 if limit_s == EXIT_LIMIT_S else 20
    gates = tmp_path / "gates"
    cmd = Command(tmp_path, f"tests.serving.helpers:GatedJpeg?gate_dir={gates}", "--replicas", "1",
                  "--reward-on", "thread",  # the held reward must leave the listener answering
                  "--cpus-per-replica", "0.5", "--max-batch", "1", "--timeout-s", "120",
                  "--shutdown-grace-s", str(grace))
    try:
        cmd.wait_for_line("serving reward")
        gate_a, gate_b = FileGate(gates / "hold-a"), FileGate(gates / "hold-b")
        x = torch.rand(1, 3, 16, 16)
        answers = {"a": [], "b": []}
        posts = [threading.Thread(target=_post, args=(cmd.url, x, [f"hold-{k}"], answers[k])) for k in "ab"]
        posts[0].start()
        gate_a.wait_inside(1)
        posts[1].start()
        wait_until(lambda: _get(f"{cmd.url}/health")["queued"] == 1, "B to queue behind A")
        sent = cmd.ctrl_c()
        cmd.wait_for_line(f"stopping: requests in flight get up to {grace} s", timeout_s=limit_s)
        gate_a.open()
        took = cmd.assert_exits_within(sent, limit_s)
        for t in posts:
            t.join(timeout=60)
        reward = JpegCompressibility()
        (status, payload), = answers["a"]
        assert status == 200, answers
        torch.testing.assert_close(torch.tensor(payload["scores"]), reward((x * 255).round() / 255, ["hold-a"]))
        assert gate_b.entered() == 1 and not gate_b.is_open()  # B was inside the reward when its replica went
        (b,) = answers["b"]  # cut off: a connection error's name, or a 5xx from Serve's proxy
        assert isinstance(b, str) or b[0] >= 500, answers
        print(f"exited {took:.1f} s after Ctrl-C; B got {answers['b']}")
    finally:
        cmd.kill()

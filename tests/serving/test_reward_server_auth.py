"""The reward server's bearer token and TLS (`digenrl.rewards.auth`).

Without Ray: where the token comes from (never the command line), what a token must be, what
counts as a loopback address, the constant-time check, and a non-loopback bind without a token
refused before Ray starts. On one small local Ray cluster: a loopback server without a token
serves anyone; one with a token answers 401 {"error": "unauthorized"} and nothing else to a
missing token, a wrong one and a header replayed from another server, on /score and /health;
`RemoteReward` sends the token, and without it fails at once naming the key, as does the
run's preflight (before any worker starts); HTTPS with a self-signed certificate works for a
client that trusts it and fails, naming the key, for one that does not.
"""

import http.client
import json
import os
import shutil
import ssl
import subprocess

import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.rewards import auth
from digenrl.rewards.auth import TOKEN_ENV, TOKEN_FILE_ENV, TokenError, read_token
from digenrl.rewards.client import RemoteReward, RemoteRewardError
from digenrl.rewards.toy import JpegCompressibility
from digenrl.rewards.wire import encode_request
from digenrl.tools.cli import main
from digenrl.tools.preflight import check_inputs

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
from digenrl.runtime.serving.reward_server import RewardServer  # noqa: E402 - needs ray[serve]

pytestmark = pytest.mark.timeout(300)

SPEC = "digenrl.rewards.toy:JpegCompressibility"
NAME = "jpeg-compressibility"
TOKEN_A = "token-of-server-a-" + "a" * 24
TOKEN_B = "token-of-server-b-" + "b" * 24


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    for key in (TOKEN_ENV, TOKEN_FILE_ENV, auth.CA_ENV):
        monkeypatch.delenv(key, raising=False)


# -- without Ray -----------------------------------------------------------------------------

def test_the_token_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    assert read_token() is None
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "t"))
    (tmp_path / "t").write_text(TOKEN_B + "\n")  # a trailing newline, as `echo` writes it
    assert read_token() == TOKEN_B
    monkeypatch.setenv(TOKEN_ENV, TOKEN_A)  # the variable before the file it names
    assert read_token() == TOKEN_A
    (tmp_path / "explicit").write_text(TOKEN_B)
    assert read_token(str(tmp_path / "explicit")) == TOKEN_B  # --token-file before both
    for bad in ("short", "with a space in it, long enough", ""):
        monkeypatch.setenv(TOKEN_ENV, bad)
        if bad:
            with pytest.raises(TokenError, match=f"\\${TOKEN_ENV}: a reward server token is at least 16 characters"):
                read_token()
    monkeypatch.delenv(TOKEN_ENV)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "missing"))
    with pytest.raises(TokenError, match="cannot read the reward server token from .*missing"):
        read_token()


def test_no_flag_takes_the_token_itself(capsys):
    from digenrl.tools.cli import build_parser, serve_options

    args = build_parser().parse_args(["reward-server", SPEC, "--token-file", "/run/secrets/token"])
    assert serve_options(args).token_file == "/run/secrets/token"
    # a token on the command line is visible to every user of the machine: refused, and not echoed
    for argv in (["--token", TOKEN_A], [f"--token={TOKEN_A}"], ["--tok", TOKEN_A]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["reward-server", SPEC, *argv])
        err = capsys.readouterr().err
        assert TOKEN_A not in err
        assert ("the token is never a command-line argument: set DIGENRL_REWARD_TOKEN" in err
                or "ambiguous option: --tok could match --token-file, --token" in err), err


def test_loopback_addresses():
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert auth.is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "192.168.1.1", "no-such-host.invalid"):
        assert not auth.is_loopback(host), host


def test_the_check_is_on_digests_and_wants_the_bearer_scheme():
    digest = auth.token_digest(TOKEN_A)
    assert auth.authorized(f"Bearer {TOKEN_A}", digest) and auth.authorized(f"bearer {TOKEN_A}", digest)
    for header in (None, "", "Bearer", f"Bearer {TOKEN_B}", f"Bearer {TOKEN_A[:-1]}", f"Basic {TOKEN_A}",
                   f"Bearer {TOKEN_A}x", TOKEN_A):
        assert not auth.authorized(header, digest), header


def test_a_non_loopback_bind_without_a_token_is_refused_before_ray_starts(capsys):
    started = ray.is_initialized()
    for host in ("0.0.0.0", "10.0.0.5"):
        with pytest.raises(ValueError, match=f"--host {host} lets other machines reach the reward server, and it "
                                             f"has no token.*export {TOKEN_ENV}=.*--token-file"):
            RewardServer(SPEC, host=host, port=0).start()
    assert ray.is_initialized() == started  # refused before Ray
    assert main(["reward-server", SPEC, "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "has no token" in err and TOKEN_ENV in err and TOKEN_FILE_ENV in err


def test_a_remote_reward_never_shows_its_token():
    r = RemoteReward("http://127.0.0.1:1", NAME, token=TOKEN_A)
    assert TOKEN_A not in repr(r) and "token=set" in repr(r)


# -- on a local Ray cluster ------------------------------------------------------------------

def _certificate(tmp) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a test certificate")
    cert, key = str(tmp / "cert.pem"), str(tmp / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Three servers at once on a 2-CPU cluster (half a CPU per replica): "open" (loopback, no
    token), "a" (TOKEN_A) and "b" (TOKEN_B, over HTTPS with a self-signed certificate)."""
    if ray.is_initialized():  # another module's cluster: this one needs its own, sized and empty
        ray.shutdown()
    cert, key = _certificate(tmp_path_factory.mktemp("tls"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    common = {"port": 0, "replicas": 1, "cpus_per_replica": 0.5}
    started = []
    try:
        for name, kwargs in {"open": {"token": ""}, "a": {"token": TOKEN_A},
                             "b": {"token": TOKEN_B, "tls_cert": cert, "tls_key": key}}.items():
            started.append(RewardServer(SPEC, app_name=f"reward-{name}", **common, **kwargs).start())
        yield dict(zip(["open", "a", "b"], started)) | {"cert": cert}
    finally:
        for s in reversed(started):  # the first one started Serve, and its stop() shuts Serve down
            s.stop()
        serve.shutdown()
        ray.shutdown()


def ask(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    if server.url.startswith("https"):
        ctx = ssl.create_default_context(cafile=server.options.tls_cert)
        conn = http.client.HTTPSConnection(server.host, server.port, timeout=30, context=ctx)
    else:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), dict(resp.getheaders())
    finally:
        conn.close()


@pytest.mark.slow  # three Serve apps (the servers fixture); the token checks themselves run above
def test_loopback_without_a_token_serves_anyone(servers):
    s = servers["open"]
    assert not s.wants_token and s.url.startswith("http://127.0.0.1:")
    x = torch.rand(2, 3, 16, 16)
    expected = JpegCompressibility()((x * 255).round() / 255, ["a", "b"])
    torch.testing.assert_close(RemoteReward(s.url, NAME, retries=0)(x, ["a", "b"]), expected)
    # a client that has a token (of another server) is served too: the token is not asked for
    torch.testing.assert_close(RemoteReward(s.url, NAME, retries=0, token=TOKEN_A)(x, ["a", "b"]), expected)


@pytest.mark.slow  # three Serve apps (the servers fixture); the token checks themselves run above
@pytest.mark.parametrize("which", ["a", "b"])
def test_missing_wrong_and_replayed_tokens_get_401_and_nothing_else(servers, which):
    s, other = servers[which], servers["b" if which == "a" else "a"]
    token, other_token = (TOKEN_A, TOKEN_B) if which == "a" else (TOKEN_B, TOKEN_A)
    body = encode_request(torch.rand(2, 3, 16, 16), ["a", "b"], reward=NAME)
    big = encode_request(torch.rand(64, 3, 64, 64), ["p"] * 64, reward=NAME)  # 768 KiB the server never reads
    answers = set()
    refused = {
        "missing": {},
        "wrong": {"Authorization": f"Bearer {'w' * 32}"},
        "one character short": {"Authorization": f"Bearer {token[:-1]}"},
        "another scheme": {"Authorization": f"Basic {token}"},
        # the header a client of the other server sends, replayed here
        "replayed from the other server": {"Authorization": f"Bearer {other_token}"},
    }
    for why, headers in refused.items():
        for method, path, payload in (("GET", "/health", None), ("POST", "/score", body), ("POST", "/score", big),
                                      ("GET", "/nope", None)):
            status, raw, got = ask(s, method, path, payload, headers)
            assert status == 401, (why, method, path, status, raw)
            assert got.get("www-authenticate") == "Bearer"
            answers.add(raw)
    assert answers == {json.dumps({"error": "unauthorized"}, separators=(",", ":")).encode()}  # one answer for all
    # the right token: scored; the other server refuses it in turn
    status, raw, _ = ask(s, "POST", "/score", body, {"Authorization": f"Bearer {token}"})
    assert status == 200 and len(json.loads(raw)["scores"]) == 2
    assert ask(other, "GET", "/health", None, {"Authorization": f"Bearer {token}"})[0] == 401
    assert s.health()["served"] >= 1  # the server's own probe carries its token


@pytest.mark.slow  # three Serve apps (the servers fixture); the token checks themselves run above
def test_remote_reward_sends_the_token_and_names_the_key_without_it(servers, monkeypatch):
    s, x = servers["a"], torch.rand(3, 3, 16, 16)
    expected = JpegCompressibility()((x * 255).round() / 255, ["a", "b", "c"])
    monkeypatch.setenv(TOKEN_ENV, TOKEN_A)
    torch.testing.assert_close(RemoteReward(s.url, NAME, retries=0)(x, ["a", "b", "c"]), expected)
    monkeypatch.delenv(TOKEN_ENV)
    waits = []
    with pytest.raises(RemoteRewardError, match=f"401 Unauthorized: it wants a token and none is set: set {TOKEN_ENV}") as info:
        RemoteReward(s.url, NAME, retries=3, sleep=waits.append)(x, ["a", "b", "c"])
    assert info.value.status == 401 and waits == []  # no retry
    monkeypatch.setenv(TOKEN_ENV, TOKEN_B)
    with pytest.raises(RemoteRewardError, match=f"refused the token from \\${TOKEN_ENV}: that is not this server's"):
        RemoteReward(s.url, NAME, retries=3, sleep=waits.append).health()
    # the config's way to a served reward reads the same environment
    from digenrl.rewards import build_reward

    monkeypatch.setenv(TOKEN_ENV, TOKEN_A)
    torch.testing.assert_close(build_reward("remote", {"remote": f"{s.url}#{NAME}"})(x, ["a", "b", "c"]), expected)


@pytest.mark.slow  # three Serve apps (the servers fixture); the token checks themselves run above
def test_a_run_without_the_token_stops_before_it_starts(servers, monkeypatch, tmp_path):
    s = servers["a"]
    cfg = load_config(None, [f"run.run_dir={tmp_path / 'run'}", "reward.weights={remote: 1.0}",
                             f"reward.paths.remote={s.url}#{NAME}"])
    with pytest.raises(ConfigError, match=f"reward.paths.remote: reward '{NAME}' at {s.url} answered 401 "
                                          f"Unauthorized: it wants a token and none is set: set {TOKEN_ENV}"):
        check_inputs(cfg)
    monkeypatch.setenv(TOKEN_ENV, TOKEN_A)
    check_inputs(cfg)
    wrong = load_config(None, [f"run.run_dir={tmp_path / 'run'}", "reward.weights={remote: 1.0}",
                               f"reward.paths.remote={s.url}#pickscore"])
    with pytest.raises(ConfigError, match=f"serves reward '{NAME}', not 'pickscore'"):
        check_inputs(wrong)
    # `digenrl train` prints it and exits 2 before Ray or a model starts
    monkeypatch.delenv(TOKEN_ENV)
    assert main(["train", f"run.run_dir={tmp_path / 'run'}", "reward.weights={remote: 1.0}",
                 f"reward.paths.remote={s.url}#{NAME}"]) == 2


@pytest.mark.slow  # three Serve apps (the servers fixture); the token checks themselves run above
def test_https_with_the_servers_certificate(servers, monkeypatch):
    s, x = servers["b"], torch.rand(2, 3, 16, 16)
    assert s.url.startswith("https://127.0.0.1:")
    expected = JpegCompressibility()((x * 255).round() / 255, ["a", "b"])
    monkeypatch.setenv(auth.CA_ENV, servers["cert"])
    torch.testing.assert_close(RemoteReward(s.url, NAME, retries=0, token=TOKEN_B)(x, ["a", "b"]), expected)
    monkeypatch.delenv(auth.CA_ENV)
    with pytest.raises(RemoteRewardError, match=f"certificate does not check out .*set {auth.CA_ENV}"):
        RemoteReward(s.url, NAME, retries=3, token=TOKEN_B)(x, ["a", "b"])
    # plain HTTP to the TLS listener: the handshake fails, no answer
    conn = http.client.HTTPConnection(s.host, s.port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            conn.request("GET", "/health", headers={"Authorization": f"Bearer {TOKEN_B}"})
            conn.getresponse().read()
    finally:
        conn.close()


def test_tls_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="tls_key must be given with tls_cert"):
        RewardServer(SPEC, tls_cert="/x.pem")
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match="--tls-cert .*bad.pem .*not a certificate and its key"):
        RewardServer(SPEC, tls_cert=str(tmp_path / "bad.pem"), tls_key=str(tmp_path / "bad.pem")).start()
    with pytest.raises(ValueError, match="--tls-cert /no/such.pem: no such file"):
        RewardServer(SPEC, tls_cert="/no/such.pem", tls_key="/no/such.key").start()

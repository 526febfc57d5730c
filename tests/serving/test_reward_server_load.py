"""benchmarks/reward_server_load.py against a Ray Serve reward server on a local cluster.

`pytest -m load` drives it for 4 s with 8 clients and a fifth of the requests bad (so each
bad kind shows up), and runs the issue's load: 64 clients for 60 s, 5% bad. Each runs twice:
against a server without a token, and against one with a token (every request carries it, and
requests with a wrong token or none join the bad ones). Both require every good and slow
request answered with the locally computed scores and every bad one answered as documented
(400, 413, 408, 401).
"""

import importlib.util
import json
import secrets
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
from digenrl.runtime.serving.reward_server import RewardServer  # noqa: E402 - needs ray[serve]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reward_server_load.py"
spec = importlib.util.spec_from_file_location("reward_server_load", SCRIPT)
load = sys.modules["reward_server_load"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(load)

LIMITS = {"max_request_bytes": 2**20, "read_timeout_s": 2.0, "client_timeout_s": 60.0}


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():  # another module's cluster: this one needs its own, sized and empty
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module", params=["no-token", "token"])
def server(cluster, request):
    """The server, without a token and then with one (pytest runs each parameter's tests together)."""
    token = secrets.token_urlsafe(32) if request.param == "token" else ""
    with RewardServer(load.REWARD_SPEC, port=0, max_request_mb=1.0, read_timeout_s=LIMITS["read_timeout_s"],
                      token=token) as s:
        s.token = token or None
        yield s


def check(result: dict, clients: int) -> None:
    print(json.dumps(result, indent=1))
    requests = result["requests"]
    assert result["ok"] and result["good_lost_or_wrong"] == 0 and result["slow_lost_or_wrong"] == 0
    assert result["connection_errors"] == 0
    assert requests["good"]["correct"] == requests["good"]["sent"] >= 4 * clients
    assert requests["malformed"]["statuses"].keys() <= {"400"}
    assert requests["oversized"]["statuses"].keys() <= {"413"}
    assert requests["stalled"]["statuses"].keys() <= {"408", "cut"}
    assert requests.get("unauthorized", {"statuses": {}})["statuses"].keys() <= {"401"}


@pytest.mark.load  # with the 60 s run below (CI runs the load tier)
@pytest.mark.timeout(120)
def test_short_load_loses_no_good_request(server):
    result = load.run_load(server.url, clients=8, duration_s=4.0, bad_fraction=0.2, limits=LIMITS, token=server.token)
    check(result, clients=8)
    kinds = ("malformed", "oversized", "slow", "stalled") + (("unauthorized",) if server.token else ())
    assert all(result["requests"][k]["sent"] > 0 for k in kinds)
    assert ("unauthorized" in result["requests"]) == bool(server.token)


@pytest.mark.load
@pytest.mark.timeout(600)
def test_64_clients_for_60_s_lose_no_good_request(server):
    result = load.run_load(server.url, clients=64, duration_s=60.0, bad_fraction=0.05, limits=LIMITS, token=server.token)
    check(result, clients=64)

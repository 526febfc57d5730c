"""runtime.network_interface: what the key gives every actor, and what it refuses."""

import os

import pytest

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.runtime.cluster import interface_ip, network_options

from .conftest import tiny

ray = pytest.importorskip("ray")


def test_interface_address_and_unknown_interface():
    assert interface_ip("lo") == "127.0.0.1"
    with pytest.raises(RuntimeError, match=r"runtime.network_interface='nope0'.*interfaces: .*\blo\b"):
        interface_ip("nope0")


def test_actors_get_the_interface_in_their_environment(ray_cluster):
    @ray.remote(num_cpus=0)
    def env(names):
        return {n: os.environ.get(n) for n in names}

    names = ["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]
    assert network_options(None) == {}
    assert ray.get(env.options(**network_options("lo")).remote(names), timeout=120) == dict.fromkeys(names, "lo")


# (under run.mode=local: tests/test_config_checks.py, with the other keys only a Ray run reads)
@pytest.mark.parametrize("extra, key", [
    (["runtime.network_interface=eth 0"], "runtime.network_interface"),
    (["runtime.compute=emulated", "runtime.testbed=small-h200x16-sd35", "runtime.network_interface=lo"],
     "runtime.network_interface"),
])
def test_refused_where_it_cannot_act(tmp_path, extra, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, tiny(tmp_path, "gap", *extra))

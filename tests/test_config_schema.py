"""The config is one schema: every key is described where it is declared, and
`digenrl train --help-config` prints each key with its type, default and description."""

import re

import pytest

from digenrl.tools.cli import main
from digenrl.config.keys import config_keys
from digenrl.config.schema import Config, load_config


def leaves(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        is_section = isinstance(v, dict) and k not in ("weights", "paths", "resources")
        out += leaves(v, f"{prefix}{k}.") if is_section else [f"{prefix}{k}"]
    return out


def test_every_key_is_described_where_it_is_declared():
    docs = config_keys()
    assert sorted(d.key for d in docs) == sorted(leaves(Config().to_dict()))
    bare = [d.key for d in docs if len(d.description.split()) < 3]
    assert not bare, f"keys without a description (write a comment where the field is declared): {bare}"


def test_a_pool_key_shows_that_pools_own_default():
    docs = {d.key: d for d in config_keys()}
    assert (docs["runtime.rollout.workers"].default, docs["runtime.trainer.workers"].default) == (2, 1)
    assert docs["runtime.reward.workers"].default == 0
    assert docs["model.path"].type == "str or null" and docs["reward.weights"].type == "dict[str, float]"


def test_help_config_prints_every_key_with_type_default_and_description(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help-config"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    printed = dict(re.findall(r"^  ([a-z_.]+): [^=\n]+ = (.*)$", out, re.M))
    docs = config_keys()
    assert list(printed) == [d.key for d in docs]
    for d in docs:  # the description's first words follow the key's line
        assert re.search(rf"^  {re.escape(d.key)}: .*\n      {re.escape(d.description.split()[0])}", out, re.M), d.key
    # the printed defaults are the defaults: set every key to what was printed, get Config()
    cfg = load_config(None, [f"{k}={v}" for k, v in printed.items()])
    assert cfg.to_dict() == Config().to_dict()

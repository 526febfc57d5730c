"""The run's inputs on disk, checked before any work starts (no Ray, no model load).

    check_inputs(cfg)      raises ConfigError naming the key, e.g.
                           "model.path: '/models/flux' does not exist (...)"

`Config` validation is pure (a recipe validates on a laptop whose disk has none of its
files: tests/test_recipes.py); this is the second stage, run by `digenrl train`, that
looks at the files the run is about to read: model.path, model.prompt_cache (when no text
encoder is loaded), data.prompts, data.eval_prompts (a named prompt set is fetched here, once,
into the cache), reward.paths and runtime.testbed; and that the packages run.loggers needs
are installed (wandb is an optional extra). A served reward (reward.paths.remote) is asked for
its /health with this process's token: a server that wants a token the environment does not
give (401), or that serves another reward, stops the run here, naming the key; one that does not
answer is left to the run (its workers may reach a network this machine does not).

Model and reward files are read by the Ray workers. When the run joins an existing
cluster (runtime.address or $RAY_ADDRESS) they may live on disks this machine does not
see, so those are not checked there; prompts are read here too (by the driver) and are
checked always.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl

from digenrl.config.errors import ConfigError
from digenrl.config.schema import Config

# 'org/name' as the Hugging Face hub spells repo ids: resolved through the local HF cache
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_path(value: str) -> bool:
    """A filesystem path rather than a hub id: absolute, starts with '.', or has a separator
    and is not of the form 'org/name'."""
    return os.path.isabs(value) or value.startswith(".") or (os.sep in value and not HUB_ID.fullmatch(value))


def check_inputs(cfg: Config) -> None:
    """Raise one ConfigError listing every input the run could not read (one per line)."""
    address = (cfg.runtime.address or os.environ.get("RAY_ADDRESS") or "").strip().lower()
    remote = cfg.run.mode != "local" and address not in ("", "local")  # "local": a cluster started here
    checks = [_check_prompts]
    if not remote:
        checks = [_check_model, *checks, _check_reward_paths]
    if cfg.runtime.compute == "emulated" and cfg.run.mode != "local":  # no model, prompt or reward is read
        checks = [lambda c: _check_testbed(c.runtime.testbed)]
    checks.append(_check_loggers)
    if cfg.runtime.compute != "emulated" or cfg.run.mode == "local":
        checks.append(_check_remote_reward)
    problems = []
    for check in checks:  # a recipe's placeholders all show at once, not one per attempt
        try:
            check(cfg)
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n  ".join(problems))


def _missing(key: str, value: str, what: str) -> ConfigError:
    return ConfigError(f"{key}: {value!r} does not exist ({what})")


def _check_model(cfg: Config) -> None:
    m = cfg.model
    if m.name == "tiny-dit":
        _check_tiny_dit(m.path)
        return
    if looks_like_path(m.path) and not Path(m.path).exists():
        raise _missing("model.path", m.path, f"{m.name} needs a local diffusers pipeline folder, or a hub id "
                                             "('org/name') already in the Hugging Face cache")
    if not m.text_encoders and not Path(m.prompt_cache).is_dir():
        raise _missing("model.prompt_cache", m.prompt_cache,
                       "model.text_encoders=false reads every prompt from it: fill it first (docs/guides/models.md)")


def _check_tiny_dit(path: str | None) -> None:
    from digenrl.models.tiny_dit_weights import check_tiny_dit_file, find_base, missing_base_message

    if path is None:  # the shipped base
        if find_base() is None:
            raise ConfigError(f"model.path: unset, and {missing_base_message()}")
        return
    if not Path(path).is_file():
        raise _missing("model.path", path, "tiny-dit needs a .safetensors file written by digenrl")
    try:
        check_tiny_dit_file(Path(path))
    except ValueError as e:
        raise ConfigError(f"model.path: {e}") from None


def _check_prompts(cfg: Config) -> None:
    """Both prompt lists load: files exist and have prompts; a named set is fetched (or found in
    the cache) and has the recorded digests; rows carry images exactly when model.name is a
    conditioned family, and those image files exist."""
    from digenrl.data import check_conditioning, load_rows

    problems = []
    for key, spec, held_out in (("prompts", cfg.data.prompts, False),
                                ("eval_prompts", cfg.data.held_out_prompts(), True)):
        try:
            rows = load_rows(spec, held_out=held_out, progress=True)
        except (ValueError, OSError) as e:
            problems.append(f"data.{key}: {e}")
            continue
        try:
            check_conditioning(rows, cfg.model.name, f"data.{key}")
        except ValueError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n  ".join(problems))


def _reward_locations(value: str) -> list[str]:
    """The paths (or hub ids) in a reward.paths value: a bare location, or the *path
    arguments of a 'key=value&...' string (digenrl/rewards/registry_models.py)."""
    if "=" not in value:
        return [value]
    return [v for k, v in parse_qsl(value, keep_blank_values=True) if k == "path" or k.endswith("_path")]


def _check_reward_paths(cfg: Config) -> None:
    missing = []
    for name, value in cfg.reward.paths.items():
        if name == "remote" or name not in cfg.reward.weights:  # a URL; or an entry no reward uses
            continue
        for where in _reward_locations(value):
            if looks_like_path(where) and not Path(where).exists():
                missing.append(str(_missing(f"reward.paths.{name}", where,
                                            "a local model folder or file; nothing is downloaded")))
    if missing:
        raise ConfigError("\n  ".join(missing))


def _check_remote_reward(cfg: Config, timeout_s: float = 10.0) -> None:
    if "remote" not in cfg.reward.weights or "remote" not in cfg.reward.paths:
        return
    from digenrl.rewards.auth import TokenError
    from digenrl.rewards.client import RemoteReward, RemoteRewardError

    url, _, served = cfg.reward.paths["remote"].partition("#")
    try:
        health = RemoteReward(url, served, timeout_s=timeout_s, retries=0).health()
    except (TokenError, RemoteRewardError) as e:
        if isinstance(e, RemoteRewardError) and e.status != 401:
            return  # up but unwell: the run's retries decide
        raise ConfigError(f"reward.paths.remote: {e}") from None
    except OSError as e:
        if "CERTIFICATE_VERIFY_FAILED" in str(e):
            raise ConfigError(f"reward.paths.remote: {url}: its certificate does not check out ({e}); set "
                              "DIGENRL_REWARD_CA to the CA (or the server's certificate) that signed it") from None
        return  # not reachable from here: the workers may reach it
    if health.get("reward") not in (None, served):
        raise ConfigError(f"reward.paths.remote: the server at {url} serves reward {health['reward']!r}, "
                          f"not {served!r}: fix the '#{served}' part, or the URL")


def _check_loggers(cfg: Config) -> None:
    if "wandb" in cfg.run.loggers:  # the package is an optional extra
        from digenrl.io.loggers import require_wandb

        require_wandb()


def _check_testbed(testbed: str) -> None:
    from digenrl.sim.testbed import TestbedError, load_testbed

    try:
        load_testbed(testbed)
    except (TestbedError, OSError) as e:
        raise ConfigError(f"runtime.testbed: {e}") from None

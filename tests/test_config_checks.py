"""Config validation: each key acts only where it is documented, or is refused naming itself."""

import pytest

from digenrl.config import ConfigError, load_config


def _refused(overrides: list[str], *words: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    return str(e.value)


# -- run.threads vs runtime.worker_threads ------------------------------------------------
@pytest.mark.parametrize("mode", ["digenrl", "colocated", "disagg-sync"])
def test_run_threads_is_refused_on_ray(mode):
    _refused([f"run.mode={mode}", "run.threads=4"], "run.threads", "runtime.worker_threads", mode)


def test_run_threads_is_local_and_worker_threads_is_ray():
    assert load_config(None, ["run.mode=local", "run.threads=4"]).run.threads == 4
    cfg = load_config(None, ["run.mode=digenrl", "runtime.worker_threads=3"])
    assert (cfg.run.threads, cfg.runtime.worker_threads) == (0, 3)
    _refused(["run.mode=local", "run.threads=-1"], "run.threads", ">= 0")

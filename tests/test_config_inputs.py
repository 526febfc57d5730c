"""preflight.check_inputs: files the run will read are refused up front, naming the key."""

import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.tools.preflight import check_inputs, looks_like_path

FLUX = ["model.name=flux", "run.mode=local"]


def _problems(overrides: list[str]) -> str:
    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError) as e:
        check_inputs(cfg)
    return str(e.value)


@pytest.mark.parametrize("value, is_path", [
    ("/models/flux", True), ("./flux", True), ("../flux", True), (".flux", True), ("models/a/b", True),
    ("~/models/flux", True), ("black-forest-labs/FLUX.1-dev", False), ("Qwen/Qwen-Image", False), ("flux", False),
])
def test_paths_and_hub_ids(value, is_path):
    assert looks_like_path(value) is is_path


def test_diffusers_model_path_must_exist_unless_a_hub_id(tmp_path):
    assert "model.path: '/nonexistent' does not exist" in _problems(FLUX + ["model.path=/nonexistent"])
    assert "model.path" in _problems(FLUX + [f"model.path={tmp_path / 'absent'}"])
    check_inputs(load_config(None, FLUX + ["model.path=black-forest-labs/FLUX.1-dev"]))  # the loader asks the HF cache
    check_inputs(load_config(None, FLUX + [f"model.path={tmp_path}"]))


def test_prompt_cache_must_exist_when_no_text_encoder_is_loaded(tmp_path):
    base = FLUX + [f"model.path={tmp_path}", "model.text_encoders=false"]
    assert "model.prompt_cache" in _problems(base + [f"model.prompt_cache={tmp_path / 'cache'}"])
    (tmp_path / "cache").mkdir()
    check_inputs(load_config(None, base + [f"model.prompt_cache={tmp_path / 'cache'}"]))
    # with text encoders loaded, a missing cache folder is simply created on first write
    check_inputs(load_config(None, FLUX + [f"model.path={tmp_path}", f"model.prompt_cache={tmp_path / 'new'}"]))


def test_tiny_dit_path_must_be_a_tiny_dit_file(tmp_path):
    from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig
    from digenrl.models.tiny_dit_weights import save_tiny_dit

    assert "model.path" in _problems([f"model.path={tmp_path / 'm.safetensors'}"])
    assert "model.path" in _problems(["model.path=org/name"])  # no hub for the tiny DiT
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    assert "not a safetensors file" in _problems([f"model.path={tmp_path / 'junk.safetensors'}"])
    torch.manual_seed(0)
    save_tiny_dit(TinyDiT(TinyDiTConfig(depth=1)), tmp_path / "m.safetensors")
    check_inputs(load_config(None, [f"model.path={tmp_path / 'm.safetensors'}"]))
    check_inputs(load_config(None, []))  # the shipped base


def test_missing_tiny_base_is_refused_naming_model_path(tmp_path, monkeypatch):
    from digenrl.models import tiny_dit_weights

    monkeypatch.setattr(tiny_dit_weights, "ASSET", tmp_path / "absent.safetensors")
    monkeypatch.setenv("DIGENRL_CACHE", str(tmp_path))
    assert "digenrl pretrain-toy" in _problems([])


def test_prompt_files(tmp_path):
    message = _problems([f"data.prompts={tmp_path / 'train.txt'}", f"data.eval_prompts={tmp_path / 'test.txt'}",
                         "reward.weights={jpeg-compressibility: 1.0}"])
    assert "data.prompts" in message and "data.eval_prompts" in message  # both, at once
    (tmp_path / "train.txt").write_text("# only a comment\n\n")
    assert "no prompts" in _problems([f"data.prompts={tmp_path / 'train.txt'}",
                                      "reward.weights={jpeg-compressibility: 1.0}"])
    (tmp_path / "train.txt").write_text("a cat\na dog\n")
    check_inputs(load_config(None, [f"data.prompts={tmp_path / 'train.txt'}",
                                    "reward.weights={jpeg-compressibility: 1.0}"]))


def test_reward_paths(tmp_path):
    pick = ["reward.weights={pickscore: 1.0}"]
    assert "reward.paths.pickscore: '/nowhere'" in _problems(pick + ["reward.paths.pickscore=/nowhere"])
    assert "reward.paths.pickscore" in _problems(
        pick + [f"reward.paths.pickscore=path={tmp_path}&processor_path={tmp_path / 'clip'}"])
    check_inputs(load_config(None, pick + [f"reward.paths.pickscore=path={tmp_path}&processor_path={tmp_path}"]))
    check_inputs(load_config(None, pick + ["reward.paths.pickscore=yuvalkirstain/PickScore_v1"]))  # HF cache id
    check_inputs(load_config(None, ["reward.paths.pickscore=/nowhere"]))  # an entry no reward uses


def test_every_problem_is_listed_and_a_remote_cluster_checks_only_the_prompts(tmp_path, monkeypatch):
    placeholders = ["model.name=flux", "model.path=/path/to/FLUX", "data.prompts=/path/to/train.txt",
                    "reward.weights={pickscore: 1.0}", "reward.paths.pickscore=/path/to/PickScore"]
    message = _problems(placeholders + ["run.mode=local"])
    assert all(k in message for k in ("model.path", "data.prompts", "reward.paths.pickscore"))
    # on an existing cluster the workers' disks hold the model and reward files, not ours
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    message = _problems(placeholders + ["run.mode=digenrl"])
    assert "data.prompts" in message and "model.path" not in message and "reward.paths" not in message
    assert "model.path" in _problems(placeholders + ["run.mode=local"])  # local mode reads them here


def test_emulated_testbed_must_resolve():
    assert "runtime.testbed" in _problems(["runtime.compute=emulated", "runtime.testbed=no-such-preset"])
    assert "runtime.testbed" in _problems(["runtime.compute=emulated", "runtime.testbed=/no/such.yaml"])
    check_inputs(load_config(None, ["runtime.compute=emulated", "runtime.testbed=h200x16-flux"]))

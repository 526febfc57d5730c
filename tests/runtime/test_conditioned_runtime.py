"""A conditioned family (tiny FLUX.1 Kontext) on the Ray runtime: rollout workers and the reward
look each sample's image up by its coordinates, and an on-policy mode ends with the weights of
the single-device trainer."""

import pytest

from digenrl.config.schema import load_config
from digenrl.io.outputs import read_metrics
from digenrl.runtime.driver import RayDriver
from digenrl.train.trainer import Trainer

from tests.helpers.equivalence import assert_matches_single_device

from .conftest import tiny

pytest.importorskip("diffusers")


# the slow tier: the Ray path is the toy's (tests/runtime/test_equivalence.py, default tier) and the
# edit model's conditioning is checked on one device (tests/models/test_conditioned_families.py)
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["disagg-sync", "colocated"])
def test_edit_model_matches_single_device(ray_cluster, tmp_path, mode):
    from tests.models.tiny_diffusers import build_flux_kontext, tiny_images
    from tests.helpers.prompt_rows import write_rows

    folder = build_flux_kontext(tmp_path / "kontext")
    train = write_rows(tmp_path / "data", ["make it red", "add a dog", "make it red", "blur it", "add a hat"],
                       tiny_images(5, seed=1), "train.jsonl")
    held = write_rows(tmp_path / "held", ["add a hat"], tiny_images(1, seed=2), "held.jsonl")
    extra = ["model.name=flux-kontext", f"model.path={folder}", "model.height=16", "model.width=16",
             "model.max_sequence_length=8", "model.lora_rank=4", f"data.prompts={train}",
             f"data.eval_prompts={held}", "reward.weights={source-similarity: 1.0}"]
    Trainer(load_config(None, tiny(tmp_path / "local", "local", *extra)), progress=False).train()
    RayDriver(load_config(None, tiny(tmp_path / "ray", mode, *extra)), progress=False).train()

    ours, ref = read_metrics(tmp_path / "ray"), read_metrics(tmp_path / "local")
    steps = [r for r in ours if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2] and steps[0]["ratio_mean"] == 1.0
    for a, b in zip(steps, [r for r in ref if r["step"] > 0]):  # the same images -> the same rewards
        assert a["rollout/source-similarity"] == pytest.approx(b["rollout/source-similarity"], abs=1e-6)
    assert_matches_single_device(tmp_path / "ray", tmp_path / "local")

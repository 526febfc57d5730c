"""Conditioned runs' data: .jsonl rows with images, which row each sample gets, the config's
refusals, and a local trainer run of a tiny FLUX.1 Kontext whose reward sees the source."""

from __future__ import annotations


import pytest
import torch

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.data import PromptSource, check_conditioning, load_images, load_rows, read_rows
from tests.helpers.prompt_rows import write_rows




def tiny_images(n, seed, size=16):
    from tests.models.tiny_diffusers import tiny_images as make

    return make(n, seed, size)


def test_rows_read_images_relative_to_the_file(tmp_path):
    images = tiny_images(3, seed=0)
    path = write_rows(tmp_path / "data", ["make it red", "make it red", "add a hat"], images)
    rows = read_rows(path)
    assert rows.prompts == ["make it red", "make it red", "add a hat"]  # a repeated instruction stays two rows
    assert rows.images == [str((tmp_path / "data" / "img" / f"{i}.png").resolve()) for i in range(3)]
    loaded = load_images(rows.images, 16, 16)
    assert torch.equal(loaded, images)  # 8-bit images round-trip exactly
    assert load_images(rows.images[:1], 8, 12).shape == (1, 3, 8, 12)  # resized to the model's size

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "a", "image": "data/img/0.png"}\n{"prompt": "b"}\n')
    with pytest.raises(ValueError, match=r"mixed.jsonl:2: \"image\" must be on every row or on none"):
        read_rows(mixed)
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "a", "image": "nope.png"}\n')
    with pytest.raises(ValueError, match=r"missing.jsonl:1: image 'nope.png' not found"):
        read_rows(missing)
    assert load_rows(str(write_rows(tmp_path / "text", ["a", "b"]))).images is None


def test_the_coordinates_name_the_row_on_any_worker(tmp_path):
    rows = read_rows(write_rows(tmp_path, ["same"] * 4 + ["other"] * 2, tiny_images(6, seed=1)))
    a = PromptSource(rows.prompts, seed=3, groups_per_step=4, images=rows.images)
    b = PromptSource(rows.prompts, seed=3, groups_per_step=4, images=rows.images)  # another worker
    for step in range(3):  # across an epoch boundary (6 rows, 4 per step)
        for g in range(4):
            i = a.index(step, g)
            assert a.prompt(step, g) == rows.prompts[i] and a.image(step, g) == rows.images[i]
            assert b.image(step, g) == a.image(step, g)
    first_epoch = [a.index(0, g) for g in range(4)] + [a.index(1, g) for g in range(2)]
    assert sorted(first_epoch) == list(range(6))  # every row once per epoch, repeats included
    assert PromptSource(rows.prompts, 3, 4).step_images(0) is None


def test_images_exactly_for_conditioned_families(tmp_path):
    with_images = read_rows(write_rows(tmp_path / "a", ["x"], tiny_images(1, seed=0)))
    text_only = read_rows(write_rows(tmp_path / "b", ["x"]))
    check_conditioning(with_images, "flux-kontext", "data.prompts")
    check_conditioning(text_only, "flux", "data.prompts")
    with pytest.raises(ValueError, match=r"data.prompts: flux-kontext is conditioned on a reference-image"):
        check_conditioning(text_only, "flux-kontext", "data.prompts")
    with pytest.raises(ValueError, match=r"data.eval_prompts: wan takes prompts only.*use a conditioned family: "
                                         r"flux-kontext, qwen-image-edit, wan-i2v"):
        check_conditioning(with_images, "wan", "data.eval_prompts")


def test_config_refuses_conditioned_runs_without_rows(tmp_path):
    base = ["model.name=flux-kontext", f"model.path={tmp_path}", "run.mode=local"]
    with pytest.raises(ConfigError, match=r"data.prompts: flux-kontext is conditioned on a reference-image"):
        load_config(None, base)  # data.prompts=toy
    with pytest.raises(ConfigError, match=r"data.eval_prompts: .*'auto' has no images"):
        load_config(None, base + ["data.prompts=rows.jsonl"])
    with pytest.raises(ConfigError, match=r"reward.weights.source-similarity: compares each sample"):
        load_config(None, ["reward.weights={source-similarity: 1.0}"])


def test_preflight_reads_the_rows(tmp_path):
    from digenrl.tools.preflight import _check_prompts

    rows = write_rows(tmp_path, ["a red circle"], tiny_images(1, seed=0))
    cfg = load_config(None, [f"data.prompts={rows}", "data.eval_prompts=toy-held-out",
                             "reward.weights={jpeg-compressibility: 1.0}"])
    with pytest.raises(ConfigError, match="data.prompts: tiny-dit takes prompts only"):
        _check_prompts(cfg)


def test_local_run_of_an_edit_model(tmp_path, tiny_overrides):
    """flux-kontext through the local Trainer: every sample is conditioned on its row's image,
    the reward sees that image as its source, the first update has ratio 1, and the held-out
    evaluation samples its own rows' images."""
    pytest.importorskip("diffusers")
    from tests.models.tiny_diffusers import build_flux_kontext
    from digenrl.train.trainer import Trainer, plan_step

    folder = build_flux_kontext(tmp_path / "kontext")
    train = write_rows(tmp_path / "data", ["make it red", "add a dog", "make it red", "blur it"],
                       tiny_images(4, seed=1), "train.jsonl")
    held = write_rows(tmp_path / "held", ["add a hat", "make it blue"], tiny_images(2, seed=2), "held.jsonl")
    overrides = [o for o in tiny_overrides if not o.startswith(("sampling.", "data."))] + [
        "model.name=flux-kontext", f"model.path={folder}", "model.height=16", "model.width=16",
        "model.max_sequence_length=8", "model.lora_rank=4", f"data.prompts={train}", f"data.eval_prompts={held}",
        "data.groups_per_step=2", "data.group_size=2", "data.micro_batch_groups=1", "data.eval_samples=1",
        "sampling.num_steps=3", "sampling.eval_num_steps=2", "train.steps=1", "run.eval_every=1",
        "reward.weights={source-similarity: 1.0}",
    ]
    trainer = Trainer(load_config(None, overrides), progress=False)
    plan = plan_step(trainer.cfg, trainer.source, 0)
    for mb in plan.micro_batches:  # each sample's image is its group's row's
        assert mb.images == [trainer.source.image(0, g) for _, g, _ in mb.coords]
    metrics = trainer.rl_step(0)
    assert metrics["ratio_mean"] == 1.0
    assert 0.0 < metrics["rollout/source-similarity"] <= 1.0
    ev = trainer.evaluate(1, save_images=False)
    assert trainer.evaluator.images == read_rows(held).images
    assert 0.0 < ev["eval/reward_mean"] <= 1.0

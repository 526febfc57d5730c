"""The family records (digenrl.models.families) agree with everything they describe: the adapter
classes, the tiny pipelines the tests build, the recipes, the simulator's catalogue and the
transformers sequence parallelism is built for. A family is declared once; this is where a
record that says something its class or files do not is caught."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path

import pytest

from digenrl.models.families import FAMILIES, Family, family, grid_family, has, names, names_with

ROOT = Path(__file__).resolve().parents[2]


def test_names_select_by_trait_in_declaration_order():
    assert names(two_experts=True) == ("wan2.2",)
    assert names(audio=True) == ("ltx2",)
    assert set(names(conditioning="first-frame")) == {"wan-i2v", "hunyuan-video-1.5-i2v"}
    assert list(names()) == list(FAMILIES)
    with pytest.raises(TypeError, match="no trait"):
        names(colour="red")
    assert not has("tiny-dit", "output") and has("wan", "sequence_parallel")
    # names_with: the trait set to any value, in declaration order
    assert names_with("conditioning")[:3] == ("flux-kontext", "qwen-image-edit", "wan-i2v")
    assert set(names_with("conditioning")) == {n for n in FAMILIES if FAMILIES[n].conditioning is not None}
    assert names_with("audio") == names(audio=True)
    with pytest.raises(ValueError, match="unknown; allowed: flux, sd3"):
        family("flux3")
    assert grid_family("wan-i2v").name == "wan" and grid_family("sana").name == "sana"


def test_a_record_refuses_what_cannot_be():
    with pytest.raises(ValueError, match="output"):
        Family("x", "m:C", "x", "x-1b", "x.yaml", output="audio")
    with pytest.raises(ValueError, match="conditioning"):
        Family("x", "m:C", "x", "x-1b", "x.yaml", conditioning="depth-map")
    with pytest.raises(ValueError, match="audio track comes with a video"):
        Family("x", "m:C", "x", "x-1b", "x.yaml", audio=True)
    with pytest.raises(ValueError, match="grid_rule"):
        Family("x", "m:C", "x", "x-1b", "x.yaml", grid_rule="cosine")
    with pytest.raises(ValueError, match="without a grid_rule"):
        Family("x", "m:C", "x", "x-1b", "x.yaml", scheduler={"shift": 3.0})


def test_every_base_family_has_its_own_grid():
    for f in FAMILIES.values():
        if f.base:
            assert FAMILIES[f.base].grid and not f.grid and not f.grid_near_one and f.conditioning, f.name


@pytest.mark.parametrize("name", list(FAMILIES))
def test_recipe_and_catalogue_entry(name):
    from digenrl.config.schema import load_config
    from digenrl.sim.catalogue import MODELS, family_of

    f = FAMILIES[name]
    recipe = ROOT / "recipes" / f.recipe
    assert recipe.exists(), f"{name}: no recipe {recipe}"
    assert load_config(recipe).model.name == name
    assert f.checkpoint in MODELS and family_of(f.checkpoint) == name
    assert (MODELS[f.checkpoint].kind == "video") == f.video


def test_the_adapter_classes_agree_with_their_records():
    """What the classes do, against what the records say: the traits the classes take from
    their record (a subclass could still override one), an audio track exactly where the class
    decodes one, and sequence parallelism only where the pipeline's transformer is one
    digenrl.models.sequence_parallel is built for (wan2.2 and wan-i2v have such a transformer but
    are not declared sequence-parallel: no test runs them sharded)."""
    pytest.importorskip("diffusers")
    import diffusers

    from digenrl.models.diffusers_adapters import policy_class
    from digenrl.models.sequence_parallel import SUPPORTED

    for name, f in FAMILIES.items():
        cls = policy_class(name)
        assert cls.family == name
        assert (cls.conditioning, cls.embedded_guidance, cls.two_experts, cls.output) == (
            f.conditioning, f.embedded_guidance, f.two_experts, f.output), name
        assert hasattr(cls, "decode_audio") == f.audio, name
        ann = inspect.signature(getattr(diffusers, cls.pipeline_class).__init__).parameters["transformer"].annotation
        kinds = set(re.findall(r"\w+", ann) if isinstance(ann, str) else
                    (a.__name__ for a in typing.get_args(ann) or (ann,) if isinstance(a, type)))
        assert kinds & set(SUPPORTED) or not f.sequence_parallel, (name, kinds)


def test_every_family_has_a_tiny_pipeline():
    """A family declared without a tiny build would go untested: prompt-only builds in
    tiny_diffusers.py, tiny_diffusers_new.py and tiny_diffusers_more.py, conditioned ones in
    tiny_diffusers.py and tiny_diffusers_more.py, audio + video ones and Cosmos-Predict2.5's in
    tiny_diffusers_more.py; each conditioned family among the conditioned builds."""
    pytest.importorskip("diffusers")
    from tests.models.tiny_diffusers import CONDITIONED_SETUPS, FAMILY_SETUPS
    from tests.models.tiny_diffusers_more import AUDIO_SETUPS, COSMOS_SETUPS, MORE_CONDITIONED_SETUPS, MORE_SETUPS
    from tests.models.tiny_diffusers_new import NEW_SETUPS

    conditioned = set(CONDITIONED_SETUPS) | set(MORE_CONDITIONED_SETUPS)
    assert set(FAMILIES) == (set(FAMILY_SETUPS) | set(NEW_SETUPS) | conditioned | set(MORE_SETUPS)
                             | set(AUDIO_SETUPS) | set(COSMOS_SETUPS))
    assert conditioned == {n for n, f in FAMILIES.items() if f.conditioning}


def test_nothing_in_config_names_a_family():
    """The config asks the records what a family can do (has, names, FAMILIES[...]): no string
    in digenrl/config/ is a family's name, so a new family needs no config change."""
    import ast

    found = [f"{p.name}:{node.lineno}: {node.value!r}"
             for p in sorted((ROOT / "digenrl" / "config").glob("*.py"))
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Constant) and node.value in FAMILIES]
    assert not found, "config names a family (ask digenrl.models.families instead):\n" + "\n".join(found)

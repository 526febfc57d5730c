"""Every diffusers family has a cost-model entry (sim/catalogue.py), and `digenrl plan` /
`digenrl simulate` accept it: the Config a plan writes names the family, and the simulator runs it.

Families not declared in this tree (digenrl.models.families.FAMILIES)
cannot be written as a Config (the schema refuses an unknown model.name); their plan test skips
with that reason until the family is registered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from digenrl.config.schema import dump_config, load_config
from digenrl.models.families import FAMILIES, names
from digenrl.sim import catalogue
from digenrl.sim.catalogue import (MODELS, Shape, family_models, family_of, forward_flops,
                                   latent_values, tokens_for)

# issue 28's families, each with a 16-GPU testbed (benchmarks/testbeds/h200x16-<family>.yaml)
ROUND = ("flux2", "qwen-image-2.1", "sana", "sana-video", "hunyuan-video-1.5", "hunyuan-video-1.5-i2v", "ltx2",
         "cosmos-predict2.5")
TESTBEDS = Path(__file__).resolve().parents[2] / "benchmarks" / "testbeds"


def test_every_family_has_an_entry_and_every_entry_a_family():
    assert set(ROUND) <= set(FAMILIES)
    for name, spec in FAMILIES.items():
        assert family_models(name), f"{name} has no catalogue entry"
        assert family_of(spec.checkpoint) == name, f"{name}: its recipe's checkpoint {spec.checkpoint} is not its entry"
    for name in MODELS:
        assert family_of(name) in FAMILIES, name


def test_family_is_the_longest_prefix_in_any_order(monkeypatch):
    want = {"flux.1-12b": "flux", "flux.1-kontext-12b": "flux-kontext", "flux.2-dev-32b": "flux2",
            "flux.2-klein-4b": "flux2-klein", "flux.2-klein-9b": "flux2-klein", "wan2.1-14b": "wan",
            "wan2.1-i2v-14b": "wan-i2v", "wan2.2-a14b": "wan2.2", "qwen-image-20b": "qwen-image",
            "qwen-image-edit-20b": "qwen-image-edit", "qwen-image-2.1-7b": "qwen-image-2.1",
            "hunyuanvideo-13b": "hunyuan-video", "hunyuanvideo-1.5-8b": "hunyuan-video-1.5",
            "hunyuanvideo-1.5-i2v-8b": "hunyuan-video-1.5-i2v",
            "sana-1.6b": "sana", "sana-video-2b": "sana-video", "ltx-2-19b": "ltx2",
            "cosmos-predict2.5-2b": "cosmos-predict2.5", "cosmos-predict2.5-14b": "cosmos-predict2.5"}
    assert {m: family_of(m) for m in want} == want
    # first-match in dict order (the old rule) would give "flux" for the Kontext entry when the
    # shorter prefix comes first, and the reverse order its mirror image: longest wins in both
    for order in (list(FAMILIES.items()), list(reversed(FAMILIES.items()))):
        monkeypatch.setattr(catalogue, "FAMILIES", dict(order))
        assert {m: catalogue.family_of(m) for m in want} == want
    assert family_of("no-such-model") is None


def test_cost_model_name_picks_the_familys_own_entry():
    from digenrl.profile.targets import cost_model_name

    assert cost_model_name("flux", 11.9) == "flux.1-12b"
    assert cost_model_name("flux-kontext", 11.9) == "flux.1-kontext-12b"
    assert cost_model_name("flux2-klein", 9.0) == "flux.2-klein-9b"
    assert cost_model_name("wan", 16.4) is None  # the I2V size is wan-i2v's, not wan's


def test_tokens_and_flops_by_hand():
    # SANA: DC-AE /32, patch 1 -> 32 x 32 tokens at 1024^2; text by cross-attention
    assert tokens_for("sana-1.6b") == 1024
    # LTX-2: /32 in space, 8x in time: 121 frames -> 16 latent frames of 16 x 24
    assert tokens_for("ltx-2-19b") == 16 * 16 * 24
    # HunyuanVideo-1.5: /16, 4x in time: 121 frames at 480x848 -> 31 x 30 x 53, + 1000 + 256 text
    assert tokens_for("hunyuanvideo-1.5-8b") == 31 * 30 * 53 + 1256
    # Kontext: the reference's 64 x 64 packed latents join the sample's, + 512 T5 tokens
    assert tokens_for("flux.1-kontext-12b") == 2 * 64 * 64 + 512
    with pytest.raises(ValueError, match="multiples of 32"):
        tokens_for("sana-1.6b", Shape(1040, 1024))
    with pytest.raises(ValueError, match="8k\\+1"):
        tokens_for("ltx-2-19b", Shape(512, 768, 33 + 4))
    # linear attention: the attention term is 4 d L T * head_dim, not 4 d L T^2
    t = 1024
    assert forward_flops("sana-1.6b", t) == pytest.approx(2e9 * 1.355 * t + 4 * 2240 * 20 * t * 32)
    assert forward_flops("flux.1-12b", t) == pytest.approx(2e9 * 6.45 * t + 4 * 3072 * 57 * t * t)
    # a stored latent: FLUX.2's 128 values per token, not the 16-channel /8 rule
    assert latent_values("flux.2-dev-32b", Shape(512, 512)) == 32 * 32 * 128
    assert latent_values("flux.1-12b", Shape(512, 512)) == 16 * 64 * 64


def test_every_new_entry_is_scaled_and_has_its_memory_state():
    from digenrl.sim.catalogue import TEXT_DIMS, TEXT_ENCODERS, VAES
    from digenrl.sim.costs import default_cost_model

    cm = default_cost_model()
    for name, m in MODELS.items():
        assert m.text_encoder in TEXT_ENCODERS and m.text_encoder in TEXT_DIMS and m.vae in VAES, name
        if m.scaled_from:
            assert not MODELS[m.scaled_from].scaled_from, f"{name}: scale from a measured entry"
        # the rollout's and the trainer's memory are priced (a fit report, estimated for scaled entries)
        rep = cm.fits(name, ["rollout", "trainer", "text_encoder", "vae", "reward"], "H200", lora=True)
        assert rep.peak_gib > 0 and (rep.estimated or not m.scaled_from), name


def _testbed(model: str, tmp_path):
    """16 H200s in one pool, a small workload (video: the fewest frames the VAE takes, 9 for LTX-2)."""
    from digenrl.sim.testbed import Pool, Testbed

    m = MODELS[model]
    frames = 1 + m.temporal if m.kind == "video" else 1
    side = 2 * m.spatial * 8  # 256 px for /16 families, 512 for /32
    prompts = None
    if FAMILIES[family_of(model)].conditioning:
        prompts = str(tmp_path / "rows.jsonl")  # only its name is read here (preflight reads the file)
    return Testbed(name=f"h200x16-{model}", pools=(Pool("h200", 16, "H200"),), model=model, height=side,
                   width=side, frames=frames, denoise_steps=6, trained_steps=2, group_size=4, groups_per_step=8,
                   micro_batch=1, rollout_batch=2, lora=True, weight_sync="lora-only", prompts=prompts)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_plan_config_names_the_family_and_simulates(model, tmp_path):
    """What `digenrl plan` writes for each catalogue entry is a Config the schema accepts (dumped and
    loaded back, as `digenrl train --config` reads it), and the simulator runs it."""
    from digenrl.sim.report import run_spec
    from digenrl.sim.workload import RunSpec, config_for

    name = family_of(model)
    tb = _testbed(model, tmp_path)
    spec = RunSpec("digenrl", n_rollout=8)
    cfg = config_for(tb, spec, 2)
    assert cfg.model.name == name
    path = tmp_path / "plan.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again.model.name == name and again.runtime.trainer.workers == cfg.runtime.trainer.workers
    if name == "wan2.2":
        assert cfg.runtime.trainer.shard == "none"  # the schema refuses fsdp for two experts
    res = run_spec(tb, spec, 3)
    assert res.step_s > 0 and res.throughput > 0


def test_conditioned_family_plan_needs_the_rows_file(tmp_path):
    from digenrl.config.errors import ConfigError
    from dataclasses import replace

    from digenrl.sim.workload import RunSpec, config_for

    tb = replace(_testbed("flux.1-kontext-12b", tmp_path), prompts=None)
    with pytest.raises(ConfigError, match="data.prompts.*'prompts: FILE.jsonl'"):
        config_for(tb, RunSpec("digenrl", n_rollout=8), 2)


def test_sequence_parallel_degrees_only_for_families_that_run_it():
    from digenrl.sim.sp import CATALOGUE, check_degree, degrees, runs_sp

    for model in CATALOGUE:
        assert runs_sp(model) == FAMILIES[family_of(model)].sequence_parallel
        if not runs_sp(model):  # dims known, adapter without Ulysses: planned at degree 1 only
            assert degrees(model, 8) == [1] and "no sequence-parallel" in check_degree(model, 2, "k")
    assert degrees("wan2.1-14b", 8) == [1, 2, 4, 8]


def test_new_family_testbeds_load():
    """benchmarks/testbeds/: one 16-GPU testbed per issue-28 family (not packaged presets: the
    presets are what sim_fingerprint and the preset tests run)."""
    from digenrl.sim.testbed import load_testbed

    for name in ROUND:
        tb = load_testbed(TESTBEDS / f"h200x16-{name}.yaml")
        assert family_of(tb.model) == name and tb.n_gpus == 16 and tb.name == f"h200x16-{name}"


@pytest.mark.slow
@pytest.mark.parametrize("model,cls,config", [
    ("flux.2-dev-32b", "Flux2Transformer2DModel", {}),
    ("flux.2-klein-4b", "Flux2Transformer2DModel", dict(num_layers=5, num_single_layers=20, num_attention_heads=24,
                                                        joint_attention_dim=7680, guidance_embeds=False)),
    ("flux.2-klein-9b", "Flux2Transformer2DModel", dict(num_layers=8, num_single_layers=24, num_attention_heads=32,
                                                        joint_attention_dim=12288, guidance_embeds=False)),
    ("qwen-image-2.1-7b", "QwenImage21Transformer2DModel", {}),
    ("sana-1.6b", "SanaTransformer2DModel", {}),
    ("sana-video-2b", "SanaVideoTransformer3DModel", {}),
    ("hunyuanvideo-1.5-8b", "HunyuanVideo15Transformer3DModel", {}),
    ("ltx-2-19b", "LTX2VideoTransformer3DModel", {}),
    *[(name, "CosmosTransformer3DModel", dict(  # scripts/convert_cosmos_to_diffusers.py's Cosmos-2.5 configs
        in_channels=17, out_channels=16, num_attention_heads=heads, attention_head_dim=128, num_layers=layers,
        rope_scale=(1.0, 3.0, 3.0), extra_pos_embed_type=None, use_crossattn_projection=True,
        crossattn_proj_in_channels=100352, encoder_hidden_states_channels=1024))
      for name, heads, layers in (("cosmos-predict2.5-2b", 16, 28), ("cosmos-predict2.5-14b", 40, 36))],
    ("z-image-6b", "ZImageTransformer2DModel", {}),
    ("wan2.1-i2v-14b", "WanTransformer3DModel", dict(in_channels=36, image_dim=1280, added_kv_proj_dim=5120)),
])
def test_params_are_the_diffusers_configs(model, cls, config):
    """The catalogue's parameter counts are those of the diffusers 0.42.1 class built (meta device,
    no weights) with the config quoted beside the entry (the class defaults where none is given)."""
    diffusers = pytest.importorskip("diffusers")
    import torch

    with torch.device("meta"):
        module = getattr(diffusers, cls)(**config)
    n = sum(p.numel() for p in module.parameters()) / 1e9
    assert MODELS[model].params_B == pytest.approx(n, rel=5e-3)
    m = MODELS[model]
    assert m.hidden == module.config.get("num_attention_heads", module.config.get("n_heads", 0)) * \
        module.config.get("attention_head_dim", m.hidden // max(1, module.config.get("n_heads", 1)))


@pytest.mark.parametrize("name", ROUND)
def test_new_preset_plans_as_a_config_train_accepts(name, tmp_path):
    """The preset's Config at the planner's starting point (a split pool), dumped and loaded back."""
    from digenrl.sim.testbed import load_testbed
    from digenrl.sim.workload import RunSpec, config_for

    tb = load_testbed(TESTBEDS / f"h200x16-{name}.yaml")
    path = tmp_path / "plan.yaml"
    path.write_text(dump_config(config_for(tb, RunSpec("digenrl", n_rollout=8), 2)))
    assert load_config(path).model.name == name


def test_ltx2_audio_stream_is_priced_as_its_blocks_compute():
    """LTX-2's audio tokens: the pipeline's count (pipeline_ltx2.py 1306-1310: frames / 24 fps x
    16 kHz / hop 160 / 4), linear parameters per audio token equal to those of one diffusers
    LTX2VideoTransformerBlock's audio path x 48 (meta device, the released widths), and both in
    what a forward costs and a trajectory stores."""
    pytest.importorskip("diffusers")
    import torch

    from digenrl.sim.catalogue import (Shape, audio_tokens, forward_flops, image_patches, latent_values,
                                       sample_flops, tokens_for)

    m = MODELS["ltx-2-19b"]
    assert audio_tokens(m) == round(121 / 24 * 16000 / 160 / 4) == 126
    assert audio_tokens(m, Shape(512, 768, 25)) == 26 and audio_tokens("wan2.1-14b") == 0
    from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock

    with torch.device("meta"):
        block = LTX2VideoTransformerBlock(4096, 32, 128, 4096, 2048, 32, 64, 2048)
    d_a = 2048
    per_token = {  # weights an audio token's activations are multiplied by
        "audio_attn1": ("to_q", "to_k", "to_v", "to_out.0"), "audio_attn2": ("to_q", "to_out.0"),
        "audio_ff": None, "video_to_audio_attn": ("to_q", "to_out.0"), "audio_to_video_attn": ("to_k", "to_v")}
    n = 0
    for name, parts in per_token.items():
        mod = getattr(block, name)
        linears = [mod.get_submodule(p) for p in parts] if parts else \
            [x for x in mod.modules() if isinstance(x, torch.nn.Linear)]
        n += sum(x.weight.numel() for x in linears)
    assert n == 18 * d_a**2
    assert m.audio.tok_params_B == pytest.approx(48 * n / 1e9)
    video = forward_flops(m, tokens_for(m))
    ta, tv = 126, image_patches(m)
    assert sample_flops(m) == pytest.approx(video + 2 * 48 * n * ta + 4.0 * d_a * 48 * (ta * ta + 2 * ta * tv))
    assert 1.005 < sample_flops(m) / video < 1.02
    assert latent_values(m) == tv * 128 + ta * 128
    # the cost model's per-sample work scales by sample_flops, audio included
    from digenrl.sim.costs import CostModel

    cm, short = CostModel(), Shape(512, 768, 25)
    assert cm._token_factor("ltx-2-19b", short)[0] == pytest.approx(sample_flops(m, short) / sample_flops(m))


def test_video_families_are_the_catalogues_video_entries():
    """The families declared video in digenrl.models.families (what the config reads, e.g. for
    xclip) are the families whose catalogue entries are video models, and only those."""
    video = {family_of(name) for name, m in MODELS.items() if m.kind == "video"}
    image = {family_of(name) for name, m in MODELS.items() if m.kind == "image"}
    assert set(names(video=True)) == video and not video & image

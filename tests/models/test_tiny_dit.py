"""The toy world's DiT: positions, checkpoint formats, deterministic pretraining."""

import json

import pytest
import torch
from safetensors.torch import save_file

from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig, sincos_2d
from digenrl.models.tiny_dit_weights import ASSET, load_tiny_dit
from digenrl.models.tiny_dit_weights import save_tiny_dit as save_base
from digenrl.toy.pretrain import pretrain

SMALL = TinyDiTConfig(image_size=16, patch=4, dim=32, depth=1, heads=2)


def test_sincos_positions_are_closer_for_neighbouring_patches():
    grid = 8
    pos = sincos_2d(grid, 96)
    assert pos.shape == (grid * grid, 96)
    dist = torch.cdist(pos, pos)
    a = 3 * grid + 3  # patch (3, 3)
    assert dist[a, a + 1] < dist[a, a + 4]  # right neighbour vs four columns away
    assert dist[a, a + grid] < dist[a, a + 4 * grid]  # lower neighbour vs four rows away
    assert len({tuple(p.tolist()) for p in pos}) == grid * grid  # every patch distinguishable
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d(4, 30)


def test_unknown_position_embedding_is_refused():
    with pytest.raises(ValueError, match="pos_embed"):
        TinyDiT(TinyDiTConfig(pos_embed="rope"))


def test_checkpoint_round_trip_and_files_without_pos_embed_load_as_learned(tmp_path):
    torch.manual_seed(0)
    model = TinyDiT(SMALL)
    save_base(model, tmp_path / "m.safetensors")
    again = load_tiny_dit(tmp_path / "m.safetensors")
    x, sigma, tokens = torch.randn(2, 3, 16, 16), torch.tensor([0.3, 0.9]), torch.ones(2, 8, dtype=torch.long)
    for p in model.parameters():  # adaLN-zero starts as identity: perturb so outputs are not all zero
        p.data.add_(0.01 * torch.randn_like(p))
    save_base(model, tmp_path / "m.safetensors")
    assert torch.equal(load_tiny_dit(tmp_path / "m.safetensors")(x, sigma, tokens), model(x, sigma, tokens))
    assert again.config == SMALL

    old_cfg = {k: v for k, v in SMALL.__dict__.items() if k != "pos_embed"}  # written before sin-cos existed
    old = TinyDiT(TinyDiTConfig(**old_cfg, pos_embed="learned"))
    meta = {"config": json.dumps(old_cfg), "format": "digenrl.tiny_dit"}
    save_file(old.state_dict(), str(tmp_path / "old.safetensors"), metadata=meta)
    assert load_tiny_dit(tmp_path / "old.safetensors").config.pos_embed == "learned"


def test_pretraining_is_deterministic_and_restores_threads():
    threads = torch.get_num_threads()
    a = pretrain(steps=3, batch=4, config=SMALL, progress=False)
    b = pretrain(steps=3, batch=4, config=SMALL, progress=False)
    assert torch.get_num_threads() == threads
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.patch_out.weight, torch.zeros_like(a.patch_out.weight))  # it did train


def test_pretraining_captions_are_noisy_unless_told_otherwise():
    noisy = pretrain(steps=3, batch=8, config=SMALL, progress=False)  # CAPTION_NOISE
    exact = pretrain(steps=3, batch=8, config=SMALL, progress=False, caption_noise={})
    assert not all(torch.equal(a, b) for a, b in zip(noisy.state_dict().values(), exact.state_dict().values()))


def test_shipped_base_matches_the_current_architecture():
    model = load_tiny_dit(ASSET)
    assert model.config == TinyDiTConfig()  # pretrain()'s default config is what ships


def test_lora_init_is_the_same_in_every_process():
    # Data-parallel trainers each inject adapters; the global RNG differs between processes.
    from digenrl.models.lora import LoraSpec, apply_lora
    from digenrl.models.tiny_dit import LORA_TARGETS

    spec = LoraSpec(rank=4, alpha=4, target_modules=LORA_TARGETS)
    torch.manual_seed(1)
    a = apply_lora(TinyDiT(SMALL), spec)
    torch.manual_seed(2)
    b = apply_lora(TinyDiT(SMALL), spec)
    lora_a = {k: v for k, v in a.state_dict().items() if "lora_A" in k}
    assert lora_a and all(torch.equal(v, b.state_dict()[k]) for k, v in lora_a.items())
    w = next(iter(lora_a.values()))
    assert 0 < w.abs().max() <= 1 / w.shape[1] ** 0.5  # peft's kaiming-uniform range


def test_shipped_base_loads_bit_identically():
    # the model package reads the asset itself now; every tensor must be the file's, unchanged
    from safetensors.torch import load_file

    from digenrl.models.tiny_dit_weights import load_base

    raw = load_file(str(ASSET))
    for loaded in (load_tiny_dit(ASSET), load_base()):
        state = loaded.state_dict()
        assert state.keys() == raw.keys()
        for k, v in raw.items():
            assert state[k].dtype == v.dtype and torch.equal(state[k], v), k


def test_vocab_keeps_the_token_ids_the_base_was_trained_with():
    # VOCAB moved from the toy world into the model: ids must be what the world's words gave before
    from digenrl.models.tiny_dit import VOCAB, tokenize
    from digenrl.toy.world import COLORS, COUNTS, POSITIONS, SHAPES, all_prompts

    world_words = ("<pad>", "<unk>", "on", "the") + tuple(COUNTS.values()) + tuple(COLORS) + SHAPES + tuple(
        s + "s" for s in SHAPES) + POSITIONS[1:]
    assert VOCAB == world_words
    ids = tokenize([p.text for p in all_prompts()])
    assert not (ids == 1).any(), "a toy prompt has a word outside VOCAB"
    assert tokenize(["two red circles on the left"]).tolist() == [[5, 6, 14, 2, 3, 16, 0, 0]]
    assert load_tiny_dit(ASSET).config.vocab == len(VOCAB)


def test_missing_base_names_the_command_that_rebuilds_it(tmp_path, monkeypatch):
    from digenrl.models import tiny_dit_weights

    monkeypatch.setattr(tiny_dit_weights, "ASSET", tmp_path / "absent.safetensors")
    monkeypatch.setenv("DIGENRL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match="digenrl pretrain-toy"):
        tiny_dit_weights.load_base()


def test_not_a_tiny_dit_file_is_refused(tmp_path):
    (tmp_path / "junk.safetensors").write_text("not safetensors")
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_tiny_dit(tmp_path / "junk.safetensors")
    save_file({"w": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a digenrl tiny-dit checkpoint"):
        load_tiny_dit(tmp_path / "other.safetensors")


def _grads(model: TinyDiT, x, sigma, tokens) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x, sigma, tokens).square().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_grad_ckpt_gives_the_same_gradients_and_recomputes_blocks():
    cfg = TinyDiTConfig(image_size=16, patch=4, dim=32, depth=2, heads=2)
    torch.manual_seed(0)
    model = TinyDiT(cfg)
    for p in model.parameters():  # adaLN-zero starts as identity: perturb so every block has a gradient
        p.data.add_(0.05 * torch.randn_like(p))
    x, sigma, tokens = torch.randn(3, 3, 16, 16), torch.tensor([0.2, 0.5, 0.9]), torch.randint(0, 20, (3, 8))
    calls = []
    block_forward = model.blocks[0].forward  # count this block's forwards (hooks do not rerun in recompute)

    def counted(h, c):
        calls.append(1)
        return block_forward(h, c)

    model.blocks[0].forward = counted

    plain = _grads(model, x, sigma, tokens)
    assert len(calls) == 1  # forward only
    calls.clear()
    model.enable_gradient_checkpointing()
    ckpt = _grads(model, x, sigma, tokens)
    assert len(calls) == 2, "checkpointing must recompute the block's forward during backward"
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)

    calls.clear()
    with torch.no_grad():  # rollout: nothing to recompute, no checkpoint overhead
        model(x, sigma, tokens)
    model.eval()
    model(x, sigma, tokens)
    assert len(calls) == 2


def test_build_policy_turns_grad_ckpt_on():
    from digenrl.config.model import ModelConfig
    from digenrl.models import build_policy

    assert build_policy(ModelConfig(grad_ckpt=True, lora_rank=4)).module.grad_ckpt is True
    assert build_policy(ModelConfig()).module.grad_ckpt is False

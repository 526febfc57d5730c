"""Tiny random-weight CLIP checkpoints on disk, laid out like the real ones a user downloads.

model.safetensors + config.json (CLIPModel.save_pretrained), tokenizer.json (a CLIP BPE
tokenizer over single letters, no merges), preprocessor_config.json (CLIPImageProcessor
fields). Built once per session: a few hundred KB, well under a second.
"""

from __future__ import annotations

import json
import string

import pytest
import torch
from safetensors.torch import save_file
from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

PROJECTION_DIM = 16
IMAGE_SIZE = 32


def _tiny_tokenizer() -> CLIPTokenizer:
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):  # a letter inside a word, and at its end
        for c in string.ascii_lowercase + string.digits:
            vocab[c + suffix] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[])


def save_tiny_clip(path, seed: int) -> str:
    tokenizer = _tiny_tokenizer()
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=37, num_hidden_layers=2,
            num_attention_heads=2, max_position_embeddings=24, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2,
            image_size=IMAGE_SIZE, patch_size=8,
        ),
        projection_dim=PROJECTION_DIM,
    )  # fmt: skip
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    processor = {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True, "size": {"shortest_edge": IMAGE_SIZE}, "resample": 3,
        "do_center_crop": True, "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    }  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    return str(path)


@pytest.fixture(scope="session")
def tiny_clip_dir(tmp_path_factory) -> str:
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"), seed=0)


@pytest.fixture(scope="session")
def aesthetic_head_path(tmp_path_factory) -> str:
    """A LAION-v2-shaped head (layers 0, 2, 4, 6, 7; Dropouts in between hold no weights), shrunk."""
    torch.manual_seed(1)
    dims = [PROJECTION_DIM, 32, 8, 4, 2, 1]
    state = {}
    for idx, (d_in, d_out) in zip([0, 2, 4, 6, 7], zip(dims[:-1], dims[1:])):
        state[f"layers.{idx}.weight"] = torch.randn(d_out, d_in) / d_in**0.5
        state[f"layers.{idx}.bias"] = torch.randn(d_out)
    path = tmp_path_factory.mktemp("aesthetic") / "aesthetic_head.safetensors"
    save_file(state, str(path))
    return str(path)


@pytest.fixture
def images() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 3, 40, 48, generator=g)  # non-square: exercises resize + center crop



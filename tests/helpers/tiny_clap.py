"""A tiny random-weight CLAP checkpoint saved as the released ones are (ClapModel, its
tokenizer, its feature extractor), for the `clap` reward's tests and the LTX-2 runs that score
audio with it."""

from __future__ import annotations

import string
from pathlib import Path


def build_tiny_clap(path: Path) -> Path:
    """ClapModel (RoBERTa text tower, HTS-AT audio tower), RobertaTokenizer over single
    characters, ClapFeatureExtractor at 48 kHz with a 1 s window and 16 mel bins."""
    import torch
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizer

    path.mkdir(parents=True, exist_ok=True)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
    for c in string.ascii_lowercase + string.digits:  # a character inside a word, and after a space
        vocab[c], vocab["\u0120" + c] = len(vocab), len(vocab) + 1
    tokenizer = RobertaTokenizer(vocab=vocab, merges=[], model_max_length=38)
    config = ClapConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=40, projection_dim=8),
        audio_config=dict(window_size=4, num_mel_bins=16, spec_size=64, patch_size=4, patch_stride=(4, 4),
                          patch_embeds_hidden_size=8, hidden_size=16, depths=[1, 1], num_attention_heads=[2, 2],
                          projection_dim=8, num_classes=4),
        projection_dim=8,
    )  # fmt: skip
    torch.manual_seed(0)
    ClapModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    ClapFeatureExtractor(feature_size=16, sampling_rate=48_000, hop_length=480, max_length_s=1,
                         fft_window_size=1024, truncation="rand_trunc", padding="repeatpad").save_pretrained(path)
    return path

"""Pretrain the toy base generator by flow matching (the model GRPO then post-trains).

Deterministic for a given seed and thread count: the shipped
`digenrl/assets/toy_base.safetensors` is `pretrain()` with its defaults (7000 steps, one
torch thread, ~40 min on one core), and `load_base` rebuilds exactly that and caches it
when the asset is missing.

The captions are noisy (`CAPTION_NOISE`): real generators learn from alt-text that is often
wrong about colour, count and place, and come out drawing well but binding words loosely,
which is what GenEval measures and RL post-training fixes. A base trained on exact captions
(3000 steps) leaves the default run little to fix but the sharpness of its shapes, which 60
RL steps barely move (+0.04 held-out).

The file format lives with the model (`digenrl/models/tiny_dit_weights.py`); this module
adds the toy world's training data.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

import torch
from tqdm.auto import tqdm

from digenrl.models.tiny_dit import TinyDiT, TinyDiTConfig, tokenize
from digenrl.models.tiny_dit_weights import ASSET, cache_path, find_base, load_tiny_dit, save_tiny_dit
from digenrl.toy.world import sample_batch

__all__ = ["ASSET", "PRETRAIN_STEPS", "PRETRAIN_THREADS", "load_base", "load_tiny_dit", "pretrain", "save_base"]

PRETRAIN_STEPS = 7000
WARMUP_STEPS = 100
PRETRAIN_THREADS = 1  # float sums depend on the intra-op thread count; 1 reproduces the asset
PROMPT_DROPOUT = 0.1  # unconditional training for classifier-free guidance
# Share of pretraining captions that are wrong about an attribute of their image (as web
# alt-text is): the base learns to draw the toy world's shapes, but binds colour, count and
# position to the words only loosely, which is the headroom the default RL run closes.
CAPTION_NOISE = {"color": 0.2, "count": 0.4, "position": 0.4}


def pretrain(
    steps: int = PRETRAIN_STEPS,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    config: TinyDiTConfig = TinyDiTConfig(),
    progress: bool = True,
    threads: int = PRETRAIN_THREADS,
    caption_noise: Optional[Mapping[str, float]] = None,
) -> TinyDiT:
    """caption_noise: {attribute: probability} of wrong captions (`world.mislabel`); None =
    CAPTION_NOISE, {} = exact captions."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        noise = CAPTION_NOISE if caption_noise is None else dict(caption_noise)
        return _pretrain(steps, batch, lr, seed, config, progress, noise)
    finally:
        torch.set_num_threads(previous)


def _pretrain(steps: int, batch: int, lr: float, seed: int, config: TinyDiTConfig, progress: bool,
              caption_noise: Mapping[str, float]) -> TinyDiT:
    torch.manual_seed(seed)
    model = TinyDiT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def lr_factor(i: int) -> float:  # linear warm-up, then cosine decay to a tenth
        if i < WARMUP_STEPS:
            return (i + 1) / WARMUP_STEPS
        done = (i - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc="pretrain toy base", disable=None if progress else True)  # None: off in a file
    for i in bar:
        x0, texts = sample_batch(batch, config.image_size, seed, i, caption_noise=caption_noise)
        x0 = x0 * 2 - 1  # [0,1] -> [-1,1]
        tokens = tokenize(texts, config.max_tokens)
        tokens[torch.rand(batch, generator=gen) < PROMPT_DROPOUT] = 0
        eps = torch.randn(x0.shape, generator=gen)
        sigma = torch.sigmoid(torch.randn(batch, generator=gen))  # logit-normal, as SD3 trains
        s = sigma.view(-1, 1, 1, 1)
        x_s = (1 - s) * x0 + s * eps
        loss = ((model(x_s, sigma, tokens) - (eps - x0)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if i % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
    return model


save_base = save_tiny_dit  # `digenrl pretrain-toy` writes the base in the model's own file format


def load_base(progress: bool = True) -> TinyDiT:
    """The shipped base model; if absent, pretrain once (~minutes on 2 cores) and cache it."""
    path = find_base()
    if path is not None:
        return load_tiny_dit(path)
    model = pretrain(progress=progress)
    save_base(model, cache_path())
    return model

"""A tiny diffusion transformer (DiT with joint text-image attention) that trains on a CPU.

Pixel space, no VAE: x is an image in [-1, 1], (B, 3, H, W). Prompt tokens and image
patches share one attention sequence (as in SD3/FLUX MMDiT, reduced to one stream);
the noise level enters through adaLN-zero modulation (as in DiT).

Attention is written out rather than calling scaled_dot_product_attention: on CPU,
SDPA may pick a different kernel with and without autograd, and the on-policy ratio
must come out exactly 1 when training recomputes what rollout computed.

Prompts are word-level: `VOCAB` is the toy world's words (`digenrl/toy/world.py` draws
images for them), fixed here because its order is the token ids the shipped weights were
trained with. The model owns its tokenizer, so `models` never imports `toy`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from digenrl.models.protocol import Cond

# Token ids of the shipped base (digenrl/assets/toy_base.safetensors): append, never reorder.
# 0 pads (and is the unconditional prompt), 1 is any unknown word.
VOCAB = (
    "<pad>", "<unk>", "on", "the",
    "a", "two",  # counts
    "red", "green", "blue", "yellow",  # colours
    "square", "circle", "triangle", "squares", "circles", "triangles",  # shapes
    "left", "right", "top", "bottom",  # positions
)


def tokenize(texts: list[str], max_len: int = 8) -> torch.Tensor:
    """Word-level ids over VOCAB: (B, max_len) int64, 0 = padding."""
    index = {w: i for i, w in enumerate(VOCAB)}
    out = torch.zeros(len(texts), max_len, dtype=torch.long)
    for i, t in enumerate(texts):
        ids = [index.get(w, 1) for w in t.lower().split()][:max_len]
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


@dataclass(frozen=True)
class TinyDiTConfig:
    image_size: int = 32
    channels: int = 3
    patch: int = 4
    dim: int = 96
    depth: int = 4
    heads: int = 4
    max_tokens: int = 8
    vocab: int = len(VOCAB)
    pos_embed: str = "sincos"  # "sincos": fixed 2-D sin-cos patch positions (DiT); "learned": one learned table


def _timestep_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of sigma*1000 (DiT convention), (B,) -> (B, dim)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=sigma.device, dtype=torch.float32) / half)
    args = sigma.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_2d(grid: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos position embedding of a grid x grid patch layout (DiT, MAE): (grid*grid, dim).

    Half the channels encode the row, half the column; neighbouring patches get similar codes,
    so attention can relate nearby patches from the first step instead of learning positions.
    """
    if dim % 4:
        raise ValueError(f"sin-cos 2-D position embedding needs dim divisible by 4, got {dim}")
    freqs = 1.0 / 10000.0 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))
    coords = torch.arange(grid, dtype=torch.float64)
    rows, cols = torch.meshgrid(coords, coords, indexing="ij")
    parts = []
    for axis in (rows.flatten(), cols.flatten()):
        args = axis[:, None] * freqs[None]
        parts += [torch.sin(args), torch.cos(args)]
    return torch.cat(parts, dim=1).float()


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.modulation = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.modulation.weight)  # adaLN-zero: each block starts as identity
        nn.init.zeros_(self.modulation.bias)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        # h (B, N, D) tokens, c (B, D) conditioning
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(nn.functional.silu(c)).unsqueeze(1).chunk(6, -1)
        b, n, d = h.shape
        x = self.norm1(h) * (1 + scale1) + shift1
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)  # (B, heads, N, hd)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        h = h + gate1 * self.proj((att @ v).transpose(1, 2).reshape(b, n, d))
        x = self.norm2(h) * (1 + scale2) + shift2
        return h + gate2 * self.fc2(nn.functional.gelu(self.fc1(x), approximate="tanh"))


class TinyDiT(nn.Module):
    def __init__(self, config: TinyDiTConfig = TinyDiTConfig()):
        super().__init__()
        self.config = config
        c = config
        self.grid = c.image_size // c.patch
        patch_dim = c.channels * c.patch * c.patch
        self.patch_in = nn.Linear(patch_dim, c.dim)
        if c.pos_embed == "sincos":
            self.text_pos = nn.Parameter(torch.randn(1, c.max_tokens, c.dim) * 0.02)
            self.register_buffer("patch_pos", sincos_2d(self.grid, c.dim).unsqueeze(0), persistent=False)
        elif c.pos_embed == "learned":
            self.pos = nn.Parameter(torch.randn(1, self.grid * self.grid + c.max_tokens, c.dim) * 0.02)
        else:
            raise ValueError(f"pos_embed must be 'sincos' or 'learned', got {c.pos_embed!r}")
        self.token_emb = nn.Embedding(c.vocab, c.dim)
        self.time_mlp = nn.Sequential(nn.Linear(c.dim, c.dim), nn.SiLU(), nn.Linear(c.dim, c.dim))
        self.blocks = nn.ModuleList(Block(c.dim, c.heads) for _ in range(c.depth))
        self.norm_out = nn.LayerNorm(c.dim, elementwise_affine=False, eps=1e-6)
        self.out_modulation = nn.Linear(c.dim, 2 * c.dim)
        self.patch_out = nn.Linear(c.dim, patch_dim)
        for layer in (self.out_modulation, self.patch_out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.grad_ckpt = False  # model.grad_ckpt: recompute block activations in backward

    def enable_gradient_checkpointing(self) -> None:
        """Keep only each block's input during training forwards; backward recomputes the rest.

        Same name as diffusers' models, so `build_policy` turns it on for every family alike.
        """
        self.grad_ckpt = True

    def disable_gradient_checkpointing(self) -> None:
        self.grad_ckpt = False

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        c = self.config
        b = x.shape[0]
        p, g = c.patch, self.grid
        patches = x.view(b, c.channels, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, -1)  # (B, N, C p p)
        text = self.token_emb(tokens)  # (B, T, D)
        pooled = text.mean(1)
        # fp32 tables cast to the compute dtype (the weights', or bf16 under FSDP mixed
        # precision); a no-op in fp32
        cond = self.time_mlp(_timestep_embedding(sigma, c.dim).to(text.dtype)) + pooled  # (B, D)
        if c.pos_embed == "sincos":
            h = torch.cat([text + self.text_pos, self.patch_in(patches.to(text.dtype)) + self.patch_pos.to(text.dtype)],
                          dim=1)
        else:
            h = torch.cat([text, self.patch_in(patches.to(text.dtype))], dim=1) + self.pos
        # checkpoint only when a backward will follow: rollout runs under no_grad and must
        # not pay for it (and its values are the same either way, so ratio == 1 holds)
        ckpt = self.grad_ckpt and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            h = checkpoint(block, h, cond, use_reentrant=False) if ckpt else block(h, cond)
        shift, scale = self.out_modulation(nn.functional.silu(cond)).unsqueeze(1).chunk(2, -1)
        h = self.norm_out(h[:, c.max_tokens :]) * (1 + scale) + shift
        out = self.patch_out(h)  # (B, N, C p p)
        return out.view(b, g, g, c.channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape_as(x)


LORA_TARGETS = ("qkv", "proj", "fc1", "fc2")


class TinyDiTPolicy:
    """The `Policy` protocol over TinyDiT: pixel-space latents, word-level prompts."""

    output = "image"

    def __init__(self, module: TinyDiT, device: str | torch.device = "cpu"):
        from digenrl.models.empty import move

        self.module = move(module, device)  # (parameters on meta stay there: models/empty.py)
        self.device = torch.device(device)
        c = module.config
        self.latent_shape = (c.channels, c.image_size, c.image_size)
        self.config_dict = asdict(c)

    def encode_prompts(self, prompts: Sequence[str]) -> Cond:
        return {"tokens": tokenize(list(prompts), self.module.config.max_tokens).to(self.device)}

    def negative_cond(self, batch: int) -> Cond:
        return {"tokens": torch.zeros(batch, self.module.config.max_tokens, dtype=torch.long, device=self.device)}

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond) -> torch.Tensor:
        """v(x, sigma) in float32 whatever the weights' dtype (the SDE math is float32)."""
        return self.module(x.to(self.device), sigma.to(self.device), cond["tokens"]).float()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.float() + 1.0) / 2.0).clamp(0.0, 1.0)

"""Sequence-parallel (Ulysses) gangs: the bytes each rank moves, and the share of a forward it computes.

A gang of P ranks runs one batch of b samples through the transformer together: every rank
holds every row but only L = ceil(S / P) of the S image tokens (zero-padded to P * L).
Around each attention that runs Ulysses, an all-to-all turns a token shard into a head shard
(q, k, v: all S tokens, H / P heads) and a second one turns the output back; the transformer
output is all-gathered before the unpatchify. The byte contract (what
digenrl.learner.comm.CommCounter counts per rank, the input buffer for all_to_all and
reduce_scatter, the output buffer for all_gather; nothing at P = 1):

    forward          all_to_all      4 * n_attn * b * L * H * D * e     q, k, v in, output back
                     all_gather      n_attn * b * T * H * D * e         joint text, heads gathered
                                   + b * (P * L) * C * e                output tokens (unpatchify)
    + backward       all_to_all      4 * n_attn * b * L * H * D * e
                     reduce_scatter  n_attn * b * T * H * D * e         backward of the text gather
    + recompute      the blocks' forward bytes again (grad checkpointing; not the output gather)

    H, D   attention heads, head dim              n_attn  Wan: num_layers; HunyuanVideo:
    e      bytes of the compute dtype                     num_layers + num_single_layers
    C      proj_out features per token            T       text tokens replicated in joint
           = out_channels * prod(patch)                   attention (HunyuanVideo; Wan: 0)

Compute: Ulysses splits both terms of a forward's FLOPs. A rank's linear layers see L image
tokens plus the T replicated text tokens; its attention covers H / P heads over the whole
S + T sequence (padding dropped). `rank_flops_fraction` is a rank's FLOPs over the 1-rank forward's
(>= 1 / P: padding and the replicated text are the loss).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from digenrl.models.families import has
from digenrl.learner.passes import pairs_in, pass_count, plan_passes
from digenrl.sim.catalogue import Shape, family_of, get_model, tokens_for

KINDS = ("all_to_all", "all_gather", "reduce_scatter")
DEGREES = (1, 2, 4, 8)  # candidate degrees the planner tries (one node; divisors of the heads only)


@dataclass(frozen=True)
class SpDims:
    """What the byte formulas need of a transformer (see the module doc)."""

    heads: int  # H
    head_dim: int  # D
    attn_layers: int  # n_attn: attention layers that run Ulysses
    text_tokens: int  # T: text tokens replicated inside joint attention (0: cross-attention)
    out_features: int  # C: proj_out's output features per token
    patch: tuple[int, int, int]  # (pt, ph, pw)

    @classmethod
    def from_module(cls, transformer, text_tokens: Optional[int] = None) -> "SpDims":
        """From a diffusers WanTransformer3DModel or HunyuanVideoTransformer3DModel (its config
        and proj_out). text_tokens: HunyuanVideo's text length given to the transformer (the
        adapter's max_sequence_length; default 256); Wan reads text by cross-attention."""
        c = transformer.config
        if hasattr(c, "num_single_layers"):  # HunyuanVideo: double- and single-stream joint attention
            patch = (c.patch_size_t, c.patch_size, c.patch_size)
            layers, text = c.num_layers + c.num_single_layers, 256 if text_tokens is None else text_tokens
        else:  # Wan: self-attention per block, text by cross-attention (no communication)
            patch, layers, text = tuple(c.patch_size), c.num_layers, 0
        return cls(c.num_attention_heads, c.attention_head_dim, layers, text, transformer.proj_out.out_features,
                   tuple(patch))

    @classmethod
    def from_catalogue(cls, model: str, shape: Optional[Shape] = None) -> "SpDims":
        """A catalogue model (sim.catalogue.MODELS) that has sequence parallelism (CATALOGUE);
        its joint text length is shape.text_tokens, else the model's default (tokens_for's rule)."""
        if model not in CATALOGUE:
            raise KeyError(f"{model!r} has no sequence-parallel attention; allowed: {sorted(CATALOGUE)}")
        d = CATALOGUE[model]
        m = get_model(model)
        if m.text_tokens and shape is not None and shape.text_tokens is not None:
            d = SpDims(d.heads, d.head_dim, d.attn_layers, shape.text_tokens, d.out_features, d.patch)
        return d

    def image_tokens(self, latent_shape) -> int:
        """S of a latent (C, F, H, W): (F / pt) * (H / ph) * (W / pw)."""
        _, f, h, w = latent_shape
        pt, ph, pw = self.patch
        return (f // pt) * (h // ph) * (w // pw)

    def allows(self, degree: int) -> bool:
        """Ulysses shards heads: the degree must divide them."""
        return degree >= 1 and self.heads % degree == 0


# The diffusers configs of the catalogue's video models (Wan-AI/Wan2.1-T2V-1.3B-Diffusers and
# -14B-Diffusers, hunyuanvideo-community/HunyuanVideo transformer/config.json; heads * head_dim =
# ModelSpec.hidden, checked in tests/sim/test_sp.py). Patch 1x2x2, 16 latent channels: C = 64.
CATALOGUE = {
    "wan2.1-1.3b": SpDims(12, 128, 30, 0, 64, (1, 2, 2)),
    "wan2.1-14b": SpDims(40, 128, 40, 0, 64, (1, 2, 2)),
    "hunyuanvideo-13b": SpDims(24, 128, 20 + 40, 256, 64, (1, 2, 2)),
    # hunyuanvideo-community/HunyuanVideo-1.5-480p_t2v: 54 dual-stream layers, 16 heads x 128; VAE
    # latents of 32 channels, patch 1x1x1: C = 32; 1000 + 256 text tokens joint (ModelSpec).
    "hunyuanvideo-1.5-8b": SpDims(16, 128, 54, 1256, 32, (1, 1, 1)),
    # -480p_i2v: the same transformer; SigLIP's 729 image tokens join the gathered text tokens.
    "hunyuanvideo-1.5-i2v-8b": SpDims(16, 128, 54, 1256 + 729, 32, (1, 1, 1)),
}


def image_tokens_for(model: str, shape: Shape) -> int:
    """S of a catalogue sample: its sequence (tokens_for) without the joint text tokens."""
    return tokens_for(model, shape) - SpDims.from_catalogue(model, shape).text_tokens


# ----------------------------------------------------------------------------- bytes


def forward_bytes(dims: SpDims, batch: int, tokens: int, degree: int, elem_bytes: int, backward: bool = False,
                  recompute: bool = False) -> dict[str, int]:
    """Bytes one rank counts for one transformer call over `batch` samples of `tokens` image
    tokens (S) at sequence-parallel `degree` (see the module doc). backward: a training
    forward and its backward; recompute (with backward): grad checkpointing runs every
    block's forward again in the backward. All zeros at degree 1."""
    out = dict.fromkeys(KINDS, 0)
    if degree <= 1 or batch <= 0:
        return out
    L = -(-tokens // degree)
    hd = dims.heads * dims.head_dim
    a2a = 4 * dims.attn_layers * batch * L * hd * elem_bytes  # (b, L, H*D) x q, k, v, out per layer
    text = dims.attn_layers * batch * dims.text_tokens * hd * elem_bytes  # (b, T, H*D) gathered per layer
    out["all_to_all"] = a2a
    out["all_gather"] = text + batch * degree * L * dims.out_features * elem_bytes  # (b, P*L, C)
    if backward:
        out["all_to_all"] += a2a
        out["reduce_scatter"] = text
        if recompute:
            out["all_to_all"] += a2a
            out["all_gather"] += text
    return out


def add(total: dict, part: dict, times: int = 1) -> dict:
    """total += times * part, per kind (in place; returns total)."""
    for k, v in part.items():
        total[k] = total.get(k, 0) + times * v
    return total


def generate_bytes(dims: SpDims, rows: int, steps: int, tokens: int, degree: int, elem_bytes: int,
                   cfg: bool) -> dict[str, int]:
    """One rank's bytes for `steps` denoising steps of a Generate over `rows` samples: one
    transformer call per step, CFG as one doubled batch (models.protocol.guided_velocity)."""
    return add(dict.fromkeys(KINDS, 0), forward_bytes(dims, rows * (2 if cfg else 1), tokens, degree, elem_bytes),
               steps)


def train_pass_bytes(dims: SpDims, rows: int, tokens: int, degree: int, elem_bytes: int, cfg: bool,
                     recompute: bool, ref_forward: int) -> dict[str, int]:
    """One rank's bytes for one forward/backward pass of the learner over `rows` samples
    (learner.Learner._backward_rows): the training forward and its backward (+ recompute),
    and `ref_forward` no-grad forwards over the same rows (the KL reference, DiffusionNFT's
    old policy; a bool counts as 0 or 1)."""
    b = rows * (2 if cfg else 1)
    total = forward_bytes(dims, b, tokens, degree, elem_bytes, backward=True, recompute=recompute)
    for _ in range(int(ref_forward)):
        add(total, forward_bytes(dims, b, tokens, degree, elem_bytes))
    return total


# ----------------------------------------------------------------------------- compute


def rank_flops_fraction(model: str, shape: Shape, degree: int) -> float:
    """A rank's share of one forward's FLOPs at `degree` (catalogue.forward_flops' two terms):
    linear layers over L + T tokens (padding included), attention over H / P heads of the S + T
    sequence (the runtime drops the padding before attention, models/sequence_parallel.py)."""
    if degree <= 1:
        return 1.0
    m = get_model(model)
    t = SpDims.from_catalogue(model, shape).text_tokens
    s = tokens_for(m, shape) - t
    L = -(-s // degree)
    full = 2e9 * m.tok_params_B * (s + t) + 4.0 * m.hidden * m.layers * (s + t) ** 2
    rank = 2e9 * m.tok_params_B * (L + t) + 4.0 * m.hidden * m.layers * (s + t) ** 2 / degree
    return rank / full


def runs_sp(model: str) -> bool:
    """The runtime runs `model` sequence-parallel: its dims are known (CATALOGUE) and its family's
    adapter has Ulysses attention (its `sequence_parallel` in digenrl.models.families, which the
    config checks)."""
    return model in CATALOGUE and has(family_of(model) or "", "sequence_parallel")


def check_degree(model: str, degree: int, key: str) -> Optional[str]:
    """Why `degree` cannot run `model` under config key `key` (None: it can)."""
    if degree <= 1:
        return None
    if not runs_sp(model):
        return f"{key}={degree}: {model} has no sequence-parallel attention; allowed: 1"
    heads = CATALOGUE[model].heads
    if heads % degree:
        ok = [d for d in range(1, heads + 1) if heads % d == 0]
        return f"{key}={degree}: Ulysses shards {model}'s {heads} attention heads, which {degree} does not divide; allowed: {ok}"
    return None


def degrees(model: str, limit: int) -> list[int]:
    """Degrees the planner tries for `model` up to `limit` ranks (DEGREES the heads allow)."""
    if not runs_sp(model):
        return [1]
    return [d for d in DEGREES if d <= limit and CATALOGUE[model].allows(d)]


# ----------------------------------------------------------------------------- units, summed over a gang's ranks


def group_rows(n: int, groups: int) -> list[int]:
    """Rows of each data group of a unit of n rows (runtime.gang.row_share: contiguous, the
    first n % groups groups one more)."""
    base, extra = divmod(n, groups)
    return [base + (g < extra) for g in range(groups)]


def train_unit_bytes(dims: SpDims, rows: int, trained_steps: int, gang: int, degree: int, backward_batch: int,
                     tokens: int, elem_bytes: int, cfg: bool, recompute: bool, ref_forward: int,
                     pairs_per_pass: int = 0) -> dict[str, int]:
    """A Train unit on a trainer gang of `gang` ranks, `degree` of them per data group, summed
    over the gang's ranks. Each group's (row, trained step) pairs run in the passes
    learner.passes cuts (per step in chunks of backward_batch, or packed pairs_per_pass at a
    time); every group runs as many passes as rank 0's group, the missing ones as ghost passes
    over one pair (learner.Learner.accumulate), which move bytes too."""
    total = dict.fromkeys(KINDS, 0)
    if degree <= 1:
        return total
    per = group_rows(rows, gang // degree)
    slots = range(trained_steps)
    passes = pass_count(per[0], trained_steps, backward_batch, pairs_per_pass)

    def one(b: int) -> dict:
        return train_pass_bytes(dims, b, tokens, degree, elem_bytes, cfg, recompute, ref_forward)

    for n in per:
        mine = [pairs_in(p) for p in plan_passes(0, n, slots, backward_batch, pairs_per_pass)]
        for b in mine:
            add(total, one(b), degree)
        add(total, one(1), degree * (passes - len(mine)))  # ghost passes: the unit's first pair
    return total


def gang_generate_bytes(dims: SpDims, rows: int, steps: int, gang: int, degree: int, tokens: int, elem_bytes: int,
                        cfg: bool) -> dict[str, int]:
    """A Generate unit on a gang of `gang` ranks, `degree` per data group (a rollout gang: one
    group; TAG on a trainer gang: gang / degree groups), summed over the ranks. A group without
    rows generates the unit's first row as a ghost (runtime.backend), bytes included."""
    total = dict.fromkeys(KINDS, 0)
    if degree <= 1:
        return total
    for n in group_rows(rows, gang // degree):
        add(total, generate_bytes(dims, max(n, 1), steps, tokens, degree, elem_bytes, cfg), degree)
    return total

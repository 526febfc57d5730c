"""Ulysses sequence parallelism for the video transformers (Wan2.1, HunyuanVideo, HunyuanVideo 1.5).

P ranks of a group run one forward together, each on 1/P of the video tokens:

    patchify (every rank, whole latent) -> split: rank r keeps tokens [r*L, (r+1)*L)
                                           (L = ceil(S/P); the last ranks are zero-padded)
    per attention layer:  q, k, v (B, H, L, D) --all-to-all--> (B, H/P, P*L, D): every token,
                          H/P heads; padding dropped -> attention over the S true tokens
                          (+ the T replicated text tokens of joint attention, their H/P heads)
                          --all-to-all--> (B, H, L, D); text outputs all-gathered over heads
    per-token layers (norms, MLPs, modulation): local, on L tokens
    proj_out output (B, L, C) --all-gather--> (B, S, C) -> unpatchify (every rank, whole)

So every rank ends the forward with the whole output: the SDE step, the log-prob and the
loss run replicated, and nothing after the model depends on the degree. The split drops
no token and attention sees exactly the single-device sequence, so any token count works
(no divisibility; heads must divide by P).

Gradients (training): a tensor is either sharded (the video tokens, a head shard) or
replicated (text stream, embeddings, the model output). Backward keeps one rule: a
sharded tensor's gradient is exact, a replicated tensor's gradient on a rank is that
rank's part, and the parts add up over the group. Hence: split -> backward puts the
local gradient in place (zeros elsewhere); all-to-all -> the inverse all-to-all; head
gather of the text -> reduce-scatter (sum of the parts); the output gather -> the local
slice (the loss is computed whole on every rank, so each holds the exact gradient). A
parameter's gradient is then the sum over the group, which the FSDP reduce-scatter over
the gang takes (digenrl.learner.sharded: sum, not mean).

Bytes (per rank, counted in the owner's CommCounter as comm/<phase>/<kind>_bytes;
digenrl.sim.sp predicts the same sums): all_to_all and reduce_scatter count the input
buffer, all_gather the output buffer, as digenrl.learner.comm does for FSDP.

The attention is intercepted at `torch.nn.functional.scaled_dot_product_attention`, inside
the self- and joint-attention processors only (a TorchFunctionMode around each processor
call), so the diffusers processors run unchanged: projections, QK norms and RoPE stay
theirs. That needs the native attention backend (the default); cross-attention (Wan's
attn2: video queries, text keys) needs no communication and is left alone.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SUPPORTED = ("WanTransformer3DModel", "HunyuanVideoTransformer3DModel", "HunyuanVideo15Transformer3DModel")


class SequenceParallel:
    """The sequence-parallel group of one transformer and the token layout of its forwards.

    group: the ranks that run each forward together (None or a group of one: degree 1, the
    hooks pass everything through, used to time the processor's own cost). counter: a
    digenrl.learner.comm.CommCounter for the bytes (optional).
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None, counter=None):
        self.group = group
        self.degree = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.counter = counter
        self.tokens = 0  # S: the video tokens of the current forward (set by `split`)

    @property
    def local(self) -> int:
        """L: tokens per rank (padded), ceil(S / P)."""
        return -(-self.tokens // self.degree)

    def count(self, kind: str, tensor: torch.Tensor) -> None:
        if self.counter is not None and self.degree > 1:
            self.counter.add_bytes(kind, tensor.numel() * tensor.element_size())

    # -- the token layout ---------------------------------------------------------------
    def split(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's L tokens of `x` along `dim` (zero-padded past S)."""
        if x.shape[dim] != self.tokens:
            raise ValueError(f"sequence parallel: {x.shape[dim]} positions along dim {dim}, "
                             f"the video has {self.tokens} tokens")
        if self.degree == 1:
            return x
        return _Split.apply(x, dim, self)

    def gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The S tokens of every rank along `dim` (padding dropped), on every rank."""
        if self.degree == 1:
            return x
        return _GatherTokens.apply(x, dim, self)

    # -- attention ----------------------------------------------------------------------
    def attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
        """scaled_dot_product_attention of (B, H, L + T, D) inputs: L local video tokens, then
        T replicated text tokens (joint attention; T = 0 for self-attention)."""
        if self.degree == 1 or query.shape[2] != key.shape[2]:  # cross-attention: local
            return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if is_causal or dropout_p or enable_gqa:
            raise NotImplementedError("sequence-parallel attention: causal, dropout and GQA are not supported")
        s, l = self.tokens, self.local
        text = query.shape[2] - l
        if text < 0 or query.shape[1] % self.degree:
            raise ValueError(f"sequence parallel: attention over {query.shape[2]} positions with "
                             f"{query.shape[1]} heads; expected >= {l} local tokens and heads divisible by "
                             f"{self.degree}")

        def heads_view(x):  # (B, H/P, S + T, D): every video token, text of this rank's heads
            video = _Exchange.apply(x[:, :, :l].contiguous(), self, True)[:, :, :s]
            if not text:
                return video
            return torch.cat([video, _SliceHeads.apply(x[:, :, l:], self)], dim=2)

        mask, text_valid = attn_mask, None
        if mask is not None and mask.dim() == 4 and mask.shape[2] == mask.shape[3] == l + text and text:
            # HunyuanVideo 1.5: a (B, 1, Q, K) mask, valid query & valid key, built from one key
            # mask; video tokens are always valid, so a video query's row is the key mask and a
            # video key's column the query mask. Padded text queries (no valid key) come out 0.
            text_valid = mask[:, :, l:, :1]  # (B, 1, T, 1)
            mask = mask[:, :, :1, :]
        if mask is not None:  # (B, 1, 1, L + T) key mask: all video tokens are valid
            if mask.dim() != 4 or mask.shape[2] != 1 or mask.shape[3] != l + text:
                raise NotImplementedError(f"sequence-parallel attention: a key mask (B, 1, 1, {l + text}) is "
                                          f"supported, got {tuple(mask.shape)}")
            video = torch.ones(*mask.shape[:3], s, dtype=mask.dtype, device=mask.device)
            mask = torch.cat([video, mask[..., l:]], dim=3)
        out = F.scaled_dot_product_attention(heads_view(query), heads_view(key), heads_view(value),
                                             attn_mask=mask, scale=scale)
        video = F.pad(out[:, :, :s], (0, 0, 0, self.degree * l - s))
        video = _Exchange.apply(video.contiguous(), self, False)
        if not text:
            return video
        text_out = _GatherHeads.apply(out[:, :, s:].contiguous(), self)
        if text_valid is not None:
            text_out = text_out * text_valid.to(text_out.dtype)
        return torch.cat([video, text_out], dim=2)


# ----------------------------------------------------------------------------- collectives
def _chunks(x: torch.Tensor, dim: int, sp: SequenceParallel) -> torch.Tensor:
    """`x` zero-padded along `dim` to P * L."""
    pad = sp.degree * sp.local - x.shape[dim]
    if pad == 0:
        return x
    shape = list(x.shape)
    shape[dim] = pad
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sp):
        ctx.dim, ctx.sp, ctx.size = dim, sp, x.shape[dim]
        return _chunks(x, dim, sp).narrow(dim, sp.rank * sp.local, sp.local).contiguous()

    @staticmethod
    def backward(ctx, grad):
        sp, dim = ctx.sp, ctx.dim
        shape = list(grad.shape)
        shape[dim] = sp.degree * sp.local
        full = grad.new_zeros(shape)
        full.narrow(dim, sp.rank * sp.local, sp.local).copy_(grad)
        return full.narrow(dim, 0, ctx.size), None, None


class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sp):
        ctx.dim, ctx.sp = dim, sp
        moved = x.movedim(dim, 0).contiguous()  # (L, ...)
        out = moved.new_empty((sp.degree * moved.shape[0], *moved.shape[1:]))
        sp.count("all_gather", out)
        dist.all_gather_into_tensor(out, moved, group=sp.group)
        return out[:sp.tokens].movedim(0, dim).contiguous()

    @staticmethod
    def backward(ctx, grad):
        sp, dim = ctx.sp, ctx.dim
        return _chunks(grad, dim, sp).narrow(dim, sp.rank * sp.local, sp.local).contiguous(), None, None


def _all_to_all(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """Chunk j of dim 0 goes to rank j; chunk j of the result came from rank j."""
    out = torch.empty_like(x)
    sp.count("all_to_all", x)
    dist.all_to_all_single(out, x, group=sp.group)
    return out


def _to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(B, H, L, D) this rank's tokens -> (B, H/P, P*L, D) every rank's tokens, its heads."""
    b, h, l, d = x.shape
    p = sp.degree
    send = x.view(b, p, h // p, l, d).transpose(0, 1).contiguous()  # (P, B, H/P, L, D) by head shard
    got = _all_to_all(send, sp)  # (P, B, H/P, L, D) by source rank = token shard
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * l, d)


def _to_tokens(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """(B, H/P, P*L, D) -> (B, H, L, D): the inverse of `_to_heads`."""
    b, hp, pl, d = x.shape
    p = sp.degree
    send = x.view(b, hp, p, pl // p, d).permute(2, 0, 1, 3, 4).contiguous()  # (P, B, H/P, L, D) by token shard
    got = _all_to_all(send, sp)  # (P, B, H/P, L, D) by source rank = head shard
    return got.transpose(0, 1).reshape(b, hp * p, pl // p, d)


class _Exchange(torch.autograd.Function):
    """The all-to-all between token shards and head shards; its backward goes the other way."""

    @staticmethod
    def forward(ctx, x, sp, to_heads: bool):
        ctx.sp, ctx.to_heads = sp, to_heads
        return (_to_heads if to_heads else _to_tokens)(x, sp)

    @staticmethod
    def backward(ctx, grad):
        return (_to_tokens if ctx.to_heads else _to_heads)(grad.contiguous(), ctx.sp), None, None


class _SliceHeads(torch.autograd.Function):
    """Replicated (B, H, T, D) -> this rank's heads; backward: its part of the gradient."""

    @staticmethod
    def forward(ctx, x, sp):
        ctx.sp, ctx.shape = sp, x.shape
        per = x.shape[1] // sp.degree
        return x[:, sp.rank * per:(sp.rank + 1) * per].contiguous()

    @staticmethod
    def backward(ctx, grad):
        sp = ctx.sp
        full = grad.new_zeros(ctx.shape)
        per = ctx.shape[1] // sp.degree
        full[:, sp.rank * per:(sp.rank + 1) * per] = grad
        return full, None


class _GatherHeads(torch.autograd.Function):
    """(B, H/P, T, D) head shards -> replicated (B, H, T, D); backward sums the parts."""

    @staticmethod
    def forward(ctx, x, sp):
        ctx.sp = sp
        moved = x.transpose(0, 1).contiguous()  # (H/P, B, T, D)
        out = moved.new_empty((sp.degree * moved.shape[0], *moved.shape[1:]))
        sp.count("all_gather", out)
        dist.all_gather_into_tensor(out, moved, group=sp.group)
        return out.transpose(0, 1).contiguous()

    @staticmethod
    def backward(ctx, grad):
        sp = ctx.sp
        moved = grad.transpose(0, 1).contiguous()  # (H, B, T, D)
        out = moved.new_empty((moved.shape[0] // sp.degree, *moved.shape[1:]))
        sp.count("reduce_scatter", moved)
        dist.reduce_scatter_tensor(out, moved, op=dist.ReduceOp.SUM, group=sp.group)
        return out.transpose(0, 1).contiguous(), None


# ----------------------------------------------------------------------------- the model
class _Intercept(TorchFunctionMode):
    """Routes scaled_dot_product_attention to the sequence-parallel attention."""

    def __init__(self, sp: SequenceParallel):
        super().__init__()
        self.sp = sp

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return self.sp.attention(*args, **kwargs)
        return func(*args, **kwargs)


class SequenceParallelProcessor:
    """An attention processor that runs `inner` (a diffusers processor) with its
    scaled_dot_product_attention made sequence-parallel."""

    def __init__(self, inner, sp: SequenceParallel):
        backend = getattr(inner, "_attention_backend", None)
        if backend not in (None, "native") and str(backend) not in ("AttentionBackendName.NATIVE",):
            raise ValueError(f"sequence parallelism needs the native attention backend, got {backend}")
        self.inner, self.sp = inner, sp
        # diffusers' Attention reads `inspect.signature(processor.__call__)` to decide which
        # keyword arguments (e.g. image_rotary_emb) the processor takes: show the inner one's
        self.__call__ = functools.wraps(inner.__call__)(lambda *args, **kwargs: self._call(*args, **kwargs))

    def _call(self, *args, **kwargs):
        with _Intercept(self.sp):
            return self.inner(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)


def enable(module: torch.nn.Module, sp: SequenceParallel) -> SequenceParallel:
    """Make a WanTransformer3DModel, HunyuanVideoTransformer3DModel or
    HunyuanVideo15Transformer3DModel run sequence-parallel over `sp` (in place; see the module
    doc for where tokens are split and gathered)."""
    kind = type(module).__name__
    if kind not in SUPPORTED:
        raise ValueError(f"sequence parallelism is built for {', '.join(SUPPORTED)}, not {kind}")
    heads = module.config.num_attention_heads
    if heads % sp.degree:
        raise ValueError(f"sequence parallelism over {sp.degree} ranks splits the attention heads: "
                         f"{kind} has {heads}, not divisible by {sp.degree}")
    if getattr(module, "_sequence_parallel", None) is not None:
        raise ValueError("sequence parallelism is already enabled on this module")
    module._sequence_parallel = sp

    def split_outputs(dim):  # the RoPE tables: (cos, sin), token axis `dim`
        return lambda mod, args, out: tuple(sp.split(o, dim) for o in out)

    if kind == "WanTransformer3DModel":
        attentions = [block.attn1 for block in module.blocks]
        module.rope.register_forward_hook(split_outputs(1))  # (1, S, 1, D) each

        def split_input(mod, args, kwargs):  # the first block's video tokens (B, S, C)
            return (sp.split(args[0], 1), *args[1:]), kwargs

        module.register_forward_pre_hook(_set_tokens_wan(sp), with_kwargs=True)
        module.blocks[0].register_forward_pre_hook(split_input, with_kwargs=True)
    elif kind == "HunyuanVideo15Transformer3DModel":  # double-stream blocks only; text + image tokens joint
        attentions = [b.attn for b in module.transformer_blocks]
        module.rope.register_forward_hook(split_outputs(0))  # (S, D) each
        module.register_forward_pre_hook(_set_tokens_hunyuan(sp), with_kwargs=True)
        module.x_embedder.register_forward_hook(lambda mod, args, out: sp.split(out, 1))  # (B, S, C)
    else:
        if getattr(module.config, "image_condition_type", None) == "token_replace":
            raise ValueError("sequence parallelism: HunyuanVideo's token-replace image conditioning is not supported")
        attentions = [b.attn for b in (*module.transformer_blocks, *module.single_transformer_blocks)]
        module.rope.register_forward_hook(split_outputs(0))  # (S, D) each
        module.register_forward_pre_hook(_set_tokens_hunyuan(sp), with_kwargs=True)
        module.x_embedder.register_forward_hook(lambda mod, args, out: sp.split(out, 1))  # (B, S, C)
    module.proj_out.register_forward_hook(lambda mod, args, out: sp.gather(out, 1))  # (B, L, C) -> (B, S, C)
    for attn in attentions:
        attn.set_processor(SequenceParallelProcessor(attn.processor, sp))
    return sp


def _latent(args, kwargs) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def _set_tokens_wan(sp: SequenceParallel):
    def hook(module, args, kwargs):
        _, _, f, h, w = _latent(args, kwargs).shape
        pt, ph, pw = module.config.patch_size
        sp.tokens = (f // pt) * (h // ph) * (w // pw)
    return hook


def _set_tokens_hunyuan(sp: SequenceParallel):
    def hook(module, args, kwargs):
        _, _, f, h, w = _latent(args, kwargs).shape
        p, pt = module.config.patch_size, module.config.patch_size_t
        sp.tokens = (f // pt) * (h // p) * (w // p)
    return hook

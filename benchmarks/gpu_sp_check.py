"""The sequence-parallel case of the GPU gang check (issue #12), run by gpu_gang_check.py.

A random-weight Wan2.1-T2V-1.3B transformer (its published config, below; nothing is
downloaded) at 33 frames of 480x832 (14,040 video tokens), bf16, batch 1, no grad:

    degree 1 (one GPU)   forward with diffusers' attention processors, then with the
                         sequence-parallel processors at degree 1 (the interception alone);
                         median ms of `repeats` forwards each, ratio; passes at <= 1.03
    degree N (N GPUs)    N ranks (NCCL) run the same forward sequence-parallel: largest
                         difference to the one-GPU output, median ms, speed-up over one GPU,
                         and the all-to-all / all-gather bytes counted against
                         digenrl.sim.sp's prediction

--tiny: a 2-layer Wan on the CPU (gloo, 2 processes): the same code path, in seconds.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.learner.comm import CommCounter  # noqa: E402
from digenrl.models import sequence_parallel as sp_mod  # noqa: E402

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json
WAN21_1_3B = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
)
LATENT = (16, 9, 60, 104)  # 33 frames of 480x832 through Wan's VAE (/4 in time, /8 in space)
TEXT = 512  # UMT5 tokens the pipeline pads to
TINY = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
TINY_LATENT, TINY_TEXT = (4, 3, 6, 10), 7  # 45 tokens: no degree divides them


def _build(tiny: bool, device: torch.device):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    dtype = torch.float32 if tiny else torch.bfloat16
    with torch.device(device):
        module = WanTransformer3DModel(**(TINY if tiny else WAN21_1_3B)).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    config = module.config
    inputs = dict(
        hidden_states=torch.randn(1, *(TINY_LATENT if tiny else LATENT), generator=g).to(device, dtype),
        timestep=torch.tensor([500.0], device=device),
        encoder_hidden_states=torch.randn(1, TINY_TEXT if tiny else TEXT, config.text_dim,
                                          generator=g).to(device, dtype),
    )
    return module, inputs


def _time(module, inputs, repeats: int, device: torch.device) -> tuple[float, torch.Tensor]:
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    times = []
    with torch.no_grad():
        out = module(**inputs, return_dict=False)[0]  # warm-up
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            out = module(**inputs, return_dict=False)[0]
            sync()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, out


def overhead(device: torch.device, tiny: bool, repeats: int) -> dict:
    """Degree 1: diffusers' processors, then the sequence-parallel ones (interception only)."""
    module, inputs = _build(tiny, device)
    plain_ms, plain = _time(module, inputs, repeats, device)
    sp_mod.enable(module, sp_mod.SequenceParallel())
    sp_ms, out = _time(module, inputs, repeats, device)
    ratio = sp_ms / plain_ms
    return {"tokens": _tokens(module, inputs), "diffusers_ms": plain_ms, "sp_degree1_ms": sp_ms, "ratio": ratio,
            "within_3pct": ratio <= 1.03, "max_abs_diff": float((out.float() - plain.float()).abs().max()),
            "repeats": repeats}


def _tokens(module, inputs) -> int:
    _, _, f, h, w = inputs["hidden_states"].shape
    pt, ph, pw = module.config.patch_size
    return (f // pt) * (h // ph) * (w // pw)


def _rank(rank: int, world: int, tmp: str, tiny: bool, repeats: int) -> None:
    device = torch.device("cpu") if tiny else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if tiny else "nccl", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world)
    try:
        module, inputs = _build(tiny, device)
        counter = CommCounter()
        sp_mod.enable(module, sp_mod.SequenceParallel(dist.group.WORLD, counter))
        with torch.no_grad():
            module(**inputs, return_dict=False)  # counted once: one forward's bytes
        counted = counter.take()
        ms, out = _time(module, inputs, repeats, device)
        if rank == 0:
            torch.save({"ms": ms, "out": out.float().cpu(), "comm": counted}, f"{tmp}/rank0.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    os._exit(0)


def multi(world: int, tiny: bool, repeats: int) -> dict:
    """Degree `world`: the sequence-parallel forward against one device's."""
    device = torch.device("cpu") if tiny else torch.device("cuda", 0)
    module, inputs = _build(tiny, device)
    one_ms, want = _time(module, inputs, repeats, device)
    del module
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(world, tmp, tiny, repeats), nprocs=world, join=True)
        got = torch.load(f"{tmp}/rank0.pt", weights_only=False)
    row = {"degree": world, "one_device_ms": one_ms, "sp_ms": got["ms"], "speedup": one_ms / got["ms"],
           "max_abs_diff": float((got["out"] - want.float().cpu()).abs().max()), "counted": got["comm"]}
    try:  # the simulator's prediction of the same forward (digenrl.sim.sp)
        from digenrl.sim.sp import SpDims, forward_bytes

        built, inputs = _build(tiny, torch.device("meta"))
        pred = forward_bytes(SpDims.from_module(built), batch=1, tokens=_tokens(built, inputs), degree=world,
                             elem_bytes=4 if tiny else 2)
        row["predicted"] = {f"comm/train/{k}_bytes": v for k, v in pred.items() if v}
        row["bytes_match"] = all(abs(row["counted"].get(k, 0) - v) <= 0.01 * v for k, v in row["predicted"].items())
    except Exception as e:  # the figures above still stand
        row["predicted_error"] = f"{type(e).__name__}: {e}"
    return row


def run(tiny: bool, repeats: int | None = None) -> dict:
    """The sequence-parallel case: degree-1 overhead on one device, degree N on N > 1."""
    device = torch.device("cpu") if tiny else torch.device("cuda", 0)
    repeats = repeats or (3 if tiny else 10)
    out = {"model": "wan2.1-1.3b" if not tiny else "tiny-wan", "latent": list(TINY_LATENT if tiny else LATENT)}
    out["degree1"] = overhead(device, tiny, repeats)
    gpus = torch.cuda.device_count() if not tiny else 2
    if gpus > 1:
        out["degreeN"] = multi(min(gpus, 4), tiny, repeats)
    else:
        out["degreeN"] = "skipped: one GPU (the multi-GPU case needs a device with more than one)"
    return out

"""GPU check of a trainer gang's pieces at world size 1: FSDP2 training memory and the relay's copy rate.

For each model (random-weight SD3.5-medium / FLUX.1-dev transformers from
digenrl/models/diffusers_adapters/configs.py; nothing is downloaded), in one process that
is a 1-rank process group (nccl on CUDA, gloo on CPU):

    build fp32 master weights --(LoRA first)--> FSDP2 units (shard_policy; bf16 compute,
    fp32 reduce) --> `steps` x (forward + backward + AdamW step) on a batch of `batch`
        peak memory      torch.cuda.max_memory_allocated over the steps (CPU: tensor bytes
                         live at the peak, torch's MemTracker), against the memory model's
                         trainer prediction (digenrl.sim.memory) for the same layout
        relay copy rate  the publish payload (full state, or the adapters under LoRA) cast to
                         bf16 and packed into flat buckets; GB/s of device->device and
                         device->(pinned) host copies of those buckets

Prints progress to stderr and ONE JSON line with everything to stdout. Exit status: 0 all
models ran, 1 a model failed (its error is in the JSON), 2 no GPU without --tiny.

    python benchmarks/gpu_gang_check.py --models sd3,flux
    python benchmarks/gpu_gang_check.py --tiny         # tiny DiT on CPU under gloo (seconds)

Then the sequence-parallel case (benchmarks/gpu_sp_check.py; --no-sp skips it): a
random-weight Wan2.1-1.3B forward with the sequence-parallel attention processors at degree 1
against diffusers' own (within 3%), and on a device with more than one GPU the forward at
degree N against one GPU's (output, speed-up, all-to-all bytes against the simulator's).

--train auto (the default) trains every weight when the memory model says a full fine-tune
fits one H200, else LoRA (FLUX.1 at 16 B/param is ~177 GiB).
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.learner.sharded import shard_policy  # noqa: E402
from digenrl.models.diffusers_adapters.configs import ARCHS, build_random  # noqa: E402
from digenrl.models.lora import LoraSpec, apply_lora  # noqa: E402
from digenrl.models.protocol import cond_repeat  # noqa: E402
from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiT, TinyDiTConfig, TinyDiTPolicy  # noqa: E402
from digenrl.sim import memory  # noqa: E402
from digenrl.sim.calibration import fit_table, load_calibration  # noqa: E402
from digenrl.sim.catalogue import GIB, lora_params_B  # noqa: E402

TINY = "tiny-dit"
LORA_RANK = 32  # the adapters' default (AdapterOptions.lora_rank) and the memory model's
SIGMA = 0.7


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def init_group(device: torch.device) -> str:
    """A 1-rank process group on a free local port: nccl on CUDA, gloo on CPU."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kw = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, **kw)
    return backend


# ----------------------------------------------------------------------------- model


def build(name: str, device: torch.device, lora: bool, grad_ckpt: bool, tiny: bool):
    """(policy, cond of batch 1): fp32 master weights, LoRA injected. tiny: sd3/flux's 1-layer configs."""
    if name == TINY:
        torch.manual_seed(0)
        policy = TinyDiTPolicy(TinyDiT(TinyDiTConfig()), device)
        if lora:
            apply_lora(policy.module, LoraSpec(rank=LORA_RANK, alpha=2.0 * LORA_RANK, target_modules=LORA_TARGETS))
        else:
            policy.module.requires_grad_(True)
        if grad_ckpt:
            policy.module.enable_gradient_checkpointing()
        return policy, policy.encode_prompts(["a red square"])
    return build_random(name, tiny, device, torch.float32, train="lora" if lora else "full",
                        lora_rank=LORA_RANK, gradient_checkpointing=grad_ckpt)


def shard(policy, device: torch.device, reshard_after_forward: bool) -> list[FSDPModule]:
    """FSDP2 over a 1-rank mesh, as a trainer gang rank does; returns the units (root last).

    reshard_after_forward=False is the runtime's reshard=after-step: gathered weights also
    stay through backward (set_reshard_after_backward(False)) until `train` reshards them
    after the optimizer step.
    """
    mesh = init_device_mesh(device.type, (1,))
    module = policy.module
    shard_policy(policy, mesh, reshard_after_forward=reshard_after_forward, mixed_precision=True)
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not reshard_after_forward:
        for unit in units:
            unit.set_reshard_after_backward(False)
    return units


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


# ----------------------------------------------------------------------------- training


def train(policy, cond, device: torch.device, batch: int, steps: int, units: list[FSDPModule],
          reshard_after_step: bool) -> dict:
    """`steps` x (forward + backward + AdamW) on a fixed random batch; peak memory over the last step."""
    module = policy.module
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)  # the Learner's optimizer (default foreach kernel)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, *policy.latent_shape, generator=g).to(device)  # (B, *latent) fp32
    target = torch.randn(x.shape, generator=g).to(device)
    sigma = torch.full((batch,), SIGMA, device=device)
    cond = cond_repeat(cond, batch)
    module.train()

    grad_bytes, no_grad = [], []

    def step() -> float:
        v = policy.velocity(x, sigma, cond)  # fp32 out; bf16 inside (FSDP casts the inputs)
        loss = (v - target).square().mean()
        loss.backward()
        grad_bytes.append(_nbytes(p.grad for p in params if p.grad is not None))
        no_grad.append(sum(p.grad is None for p in params))  # a unit whose backward hook never fired
        opt.step()
        opt.zero_grad(set_to_none=True)
        if reshard_after_step:
            for unit in units:
                unit.reshard()
        return float(loss.detach())

    times, losses = [], []
    tracker = None
    for i in range(steps):
        last = i == steps - 1
        if last and device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        if last and device.type == "cpu":
            tracker = _cpu_tracker(module, opt)
        t0 = time.perf_counter()
        if tracker is not None:
            with tracker:
                losses.append(step())
        else:
            losses.append(step())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)

    out = {
        "params": sum(_local(p).numel() for p in module.parameters()),
        "trainable_params": sum(_local(p).numel() for p in params),
        "resident_GiB": {  # exact bytes of what stays between steps (grads are freed by zero_grad)
            "weights": _nbytes(module.parameters()) / GIB,
            "optimizer": _nbytes(t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)) / GIB,
        },
        "grads_GiB": grad_bytes[-1] / GIB,  # after backward, before the optimizer step (sharded, reduce dtype)
        "trainable_tensors": len(params),
        "trainable_without_grad": no_grad[-1],
        "step_s": times,
        "losses": losses,
    }
    if device.type == "cuda":
        out["peak_GiB"] = torch.cuda.max_memory_allocated(device) / GIB
        out["peak_source"] = "torch.cuda.max_memory_allocated (last step)"
    else:
        out["peak_GiB"], out["peak_source"] = _cpu_peak(tracker)
    return out


def _cpu_tracker(module, opt):
    """torch's MemTracker (tensor bytes by kind, any device), or None where it cannot track:
    a torch without it, or frozen parameters (it hooks every parameter's gradient, and
    refuses ones that do not require grad: a LoRA base)."""
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        return None
    if not all(p.requires_grad for p in module.parameters()):
        return None
    tracker = MemTracker()
    tracker.track_external(module, opt)  # weights and the optimizer state made before it started
    return tracker


def _cpu_peak(tracker) -> tuple[float, str]:
    """Tensor bytes live at the last step's peak (MemTracker), else the process's peak RSS (an upper bound)."""
    if tracker is not None:
        snap = tracker.get_tracker_snapshot("peak")
        total = sum(dev["Total"] for dev in snap.values())
        return total / GIB, "torch MemTracker: tensor bytes live at the peak (last step)"
    import resource

    # ru_maxrss is KiB on Linux; it includes the interpreter and libraries, so it bounds the tensors from above
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, "process peak RSS (upper bound)"


def predict(table: dict, sim_name: str | None, lora: bool, grad_ckpt: bool, batch: int) -> dict | None:
    """The memory model's trainer bytes on one H200 for this layout (world size 1: no FSDP shards)."""
    if sim_name is None:
        return None
    rep = memory.fits(table, sim_name, ["trainer"], train_batch=batch, lora=lora, grad_ckpt=grad_ckpt,
                      fsdp_shards=1, lora_rank=LORA_RANK)
    m = rep.roles["trainer"]
    note = ("LoRA: the model counts a bf16 frozen base (2 B/param); this layout keeps fp32 master weights for "
            "every parameter (4 B/param), as the runtime's fsdp trainers do") if lora else None
    return {"model": sim_name, "note": note, "train_peak_GiB": rep.train_peak_gib, "weights_GiB": m.weights, "grads_GiB": m.grads,
            "optimizer_GiB": m.optimizer, "activations_GiB": m.activations, "fits_h200": rep.fits,
            "usable_GiB": rep.usable_gib, "trainable_params": (lora_params_B(sim_name, LORA_RANK) * 1e9 if lora
                                                               else None)}


def full_fits(table: dict, sim_name: str | None, grad_ckpt: bool, batch: int) -> bool:
    """--train auto: does the memory model fit a full fine-tune on one H200? (tiny: always)."""
    if sim_name is None:
        return True
    return memory.fits(table, sim_name, ["trainer"], train_batch=batch, lora=False, grad_ckpt=grad_ckpt).fits


# ----------------------------------------------------------------------------- relay


def pack_buckets(module: torch.nn.Module, lora: bool, bucket_bytes: int) -> list[torch.Tensor]:
    """The publish payload (trainable tensors under LoRA, else every weight) as bf16 flat buckets.

    Tensors are laid end to end in name order; a bucket closes when the next tensor would
    overflow it (a tensor larger than a bucket gets one of its own). Returns 1-D bf16 tensors
    on the weights' device.
    """
    names = sorted((n, p) for n, p in module.named_parameters() if p.requires_grad or not lora)
    per_bucket = bucket_bytes // 2  # bf16 elements
    groups: list[list[torch.Tensor]] = [[]]
    fill = 0
    for _, p in names:
        t = p.detach()
        t = t.full_tensor() if isinstance(t, DTensor) else t  # 1 rank: the local shard is the whole tensor
        if fill and fill + t.numel() > per_bucket:
            groups.append([])
            fill = 0
        groups[-1].append(t)
        fill += t.numel()
    buckets = []
    for group in groups:
        flat = torch.empty(sum(t.numel() for t in group), dtype=torch.bfloat16, device=group[0].device)
        off = 0
        for t in group:
            flat[off: off + t.numel()].copy_(t.reshape(-1))  # fp32 master -> bf16 payload
            off += t.numel()
        buckets.append(flat)
    return buckets


def copy_rate(buckets: list[torch.Tensor], dst: torch.Tensor, min_s: float) -> tuple[float, int]:
    """GB/s (1e9 B/s) copying every bucket into `dst` (a staging buffer the size of the largest),
    repeated until at least `min_s` seconds; (rate, passes)."""
    device = buckets[0].device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    nbytes = sum(b.numel() * b.element_size() for b in buckets)
    non_blocking = dst.is_pinned()

    def one_pass() -> None:
        for b in buckets:
            dst[: b.numel()].copy_(b, non_blocking=non_blocking)

    one_pass()  # warmup (first touch of the staging pages)
    sync()
    passes, t0 = 0, time.perf_counter()
    while True:
        one_pass()
        passes += 1
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return nbytes * passes / elapsed / 1e9, passes


def relay(module: torch.nn.Module, lora: bool, bucket_mib: float, min_s: float) -> dict:
    """Pack the payload and time device->device and device->host copies of its buckets."""
    device = next(module.parameters()).device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    buckets = pack_buckets(module, lora, int(bucket_mib * 2**20))
    sync()
    pack_s = time.perf_counter() - t0
    largest = max(b.numel() for b in buckets)
    d2d, d2d_passes = copy_rate(buckets, torch.empty(largest, dtype=torch.bfloat16, device=device), min_s)
    pinned = device.type == "cuda"  # pinning needs an accelerator; on CPU both copies are host memcpy
    host = torch.empty(largest, dtype=torch.bfloat16, pin_memory=pinned)
    d2h, d2h_passes = copy_rate(buckets, host, min_s)
    payload = sum(b.numel() * 2 for b in buckets)
    return {"payload": "adapters" if lora else "full", "payload_GB": payload / 1e9, "bucket_MiB": bucket_mib,
            "buckets": len(buckets), "pack_s": pack_s, "pack_GBps": payload / pack_s / 1e9,
            "d2d_GBps": d2d, "d2d_passes": d2d_passes, "d2h_GBps": d2h, "d2h_passes": d2h_passes,
            "host_pinned": pinned}


# ----------------------------------------------------------------------------- driver


def check_model(name: str, device: torch.device, table: dict, args, row: dict) -> None:
    """Fill `row` as it goes, so an OOM or error still reports the layout and the prediction."""
    sim_name = None if args.tiny else ARCHS[name][5]
    mode = args.train
    if mode == "auto":
        mode = "full" if full_fits(table, sim_name, args.grad_ckpt, args.batch) else "lora"
    lora = mode == "lora"
    row.update({"model": name, "train": mode, "batch": args.batch, "grad_ckpt": args.grad_ckpt,
                 "reshard_after_forward": args.reshard == "after-forward", "mixed_precision": "bf16 param, fp32 reduce",
                 "master_dtype": "float32"})
    row["predicted"] = predict(table, sim_name, lora, args.grad_ckpt, args.batch)
    if row["predicted"] is None:
        row["predicted_note"] = "no memory-model entry for the tiny configs (digenrl.sim.catalogue.MODELS)"
    policy, cond = build(name, device, lora, args.grad_ckpt, args.tiny)
    units = shard(policy, device, args.reshard == "after-forward")
    row["fsdp_units"] = len(units)
    row["measured"] = train(policy, cond, device, args.batch, args.steps, units, args.reshard == "after-step")
    if row["predicted"] is not None:
        row["peak_ratio"] = row["measured"]["peak_GiB"] / row["predicted"]["train_peak_GiB"]
    row["relay"] = relay(policy.module, lora, args.bucket_mib, args.min_copy_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help=f"comma-separated, from: {', '.join(ARCHS)} (default sd3,flux; "
                                                    f"--tiny: {TINY} by default, or sd3/flux's 1-layer configs)")
    ap.add_argument("--tiny", action="store_true", help="CPU under gloo, tiny models (smoke test, seconds)")
    ap.add_argument("--train", choices=("auto", "full", "lora"), default="auto")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="training steps; peak is taken over the last (>= 2: "
                                                         "the optimizer state exists from the first)")
    ap.add_argument("--reshard", choices=("after-forward", "after-step"), default="after-forward")
    ap.add_argument("--no-grad-ckpt", dest="grad_ckpt", action="store_false",
                    help="without gradient checkpointing (the memory model's default has it)")
    ap.add_argument("--bucket-mib", type=float, default=256.0, help="relay bucket size in MiB")
    ap.add_argument("--min-copy-s", type=float, default=None, help="time each copy rate over at least this long")
    ap.add_argument("--no-sp", dest="sp", action="store_false", help="skip the sequence-parallel case")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step creates the optimizer state)")
    names = [m for m in (args.models or (TINY if args.tiny else "sd3,flux")).split(",") if m]
    allowed = [TINY, *ARCHS] if args.tiny else list(ARCHS)
    if bad := [m for m in names if m not in allowed]:
        ap.error(f"unknown model(s) {bad}; allowed{' with --tiny' if args.tiny else ''}: {', '.join(allowed)}")
    if not args.tiny and not torch.cuda.is_available():
        log("gpu_gang_check: no CUDA device. The real-size check needs one GPU; "
            "use --tiny for the CPU smoke test (tiny DiT, gloo).")
        return 2
    device = torch.device("cpu" if args.tiny else "cuda:0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.min_copy_s is None:
        args.min_copy_s = 0.05 if args.tiny else 0.5

    backend = init_group(device)
    log(f"gpu_gang_check: device={device} backend={backend} torch={torch.__version__} models={names}")
    table = fit_table(load_calibration())
    rows = []
    try:
        for name in names:
            t0 = time.perf_counter()
            rows.append({"model": name})
            try:
                check_model(name, device, table, args, rows[-1])
            except torch.cuda.OutOfMemoryError as e:
                rows[-1]["error"] = f"OOM: {str(e).splitlines()[0]}"
            except Exception as e:  # keep going: one model's failure must not hide the others' numbers
                traceback.print_exc(file=sys.stderr)
                rows[-1]["error"] = f"{type(e).__name__}: {e}"
            rows[-1]["wall_s"] = time.perf_counter() - t0
            log(f"  {name}: done in {rows[-1]['wall_s']:.1f}s")
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        sp_row: dict = {}
        if args.sp:
            import gpu_sp_check

            t0 = time.perf_counter()
            try:
                sp_row = gpu_sp_check.run(args.tiny)
            except Exception as e:
                traceback.print_exc(file=sys.stderr)
                sp_row = {"error": f"{type(e).__name__}: {e}"}
            sp_row["wall_s"] = time.perf_counter() - t0
            log(f"  sequence parallel: done in {sp_row['wall_s']:.1f}s")
    finally:
        dist.destroy_process_group()
    print(json.dumps({
        "check": "gpu_gang_check", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "backend": backend, "world_size": 1, "tiny": args.tiny, "models": rows,
        "sequence_parallel": sp_row,
    }), flush=True)
    return 0 if all("error" not in r for r in [*rows, sp_row]) else 1


if __name__ == "__main__":
    sys.exit(main())

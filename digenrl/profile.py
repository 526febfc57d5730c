"""`digenrl profile`: measure on your own hardware what the cost model is calibrated from.

Writes JSONL lines in the format of `digenrl/sim/calibration/h200.jsonl` (keys model,
params_B, tokens, shape, what, batch, grad_ckpt, ms, peak_GB, device):

    forward                one denoising step (velocity + SDE step), no grad, per batch
    fwd+bwd                one training step (velocity + log-prob + GRPO loss + backward),
                           full fine-tune, with and without gradient checkpointing
    fwd+bwd-frozen-base    the same with LoRA on a frozen base (CostModel's LoRA timing)
    decode-*               VAE decode of final latents            (model "<vae name>")
    encode-*-tokens        text encoders, when loaded              (model "<name>-text")
    adamw-fused-step-fp32  one fused AdamW step, ms per billion fp32 parameters
    pcie                   pinned host<->device copy bandwidth (CUDA only)

    digenrl profile --model flux --path /models/FLUX.1-dev --out my_gpu.jsonl
    digenrl profile --arch sd3 --random --out my_gpu.jsonl          # random weights, no download
    digenrl profile --model tiny-dit --device cpu --out cpu.jsonl
    digenrl profile --arch sd3 --random --tiny --device cpu         # CPU smoke test

Loading the result: `CostModel(calibration="my_gpu.jsonl")`. CostModel fits only the
model names of `digenrl.sim.catalogue.MODELS` at their calibration shapes, treats every number
as measured on the reference device (H200: query it with device="H200" to mean "my GPU"),
and needs the VAE, T5 and AdamW lines too; a file with one model therefore loads only when
completed from the packaged H200 file: `--fill-from-h200` does that, replacing each
(model, what) of the H200 file that you measured. `--out` on an existing file merges the
same way, so several runs build one file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from digenrl.models.protocol import Cond, cond_repeat

SIGMA, SIGMA_NEXT, NOISE_LEVEL = 0.8, 0.7, 0.7
MEASUREMENTS = ("forward", "train", "lora", "vae", "text", "adamw", "pcie")
DIFFUSERS_FAMILIES = ("flux", "sd3", "wan", "qwen-image", "hunyuan-video")
# digenrl.sim.catalogue.MODELS name prefix of each family (the size picks the entry)
COST_MODEL_PREFIX = {"sd3": "sd3.5", "flux": "flux.1", "wan": "wan2.1", "qwen-image": "qwen-image",
                     "hunyuan-video": "hunyuanvideo"}
# text tokens inside the joint attention sequence (wan: cross-attention, none)
JOINT_TEXT = {"sd3": True, "flux": True, "wan": False, "qwen-image": True, "hunyuan-video": True}
# VAE calibration entries the cost model reads, and the one shape each was measured at
CALIB_VAES = {"flux": ("flux-vae", (1024, 1024, 1)), "wan": ("wan-vae", (480, 832, 33))}
GIB = 2.0**30
RSS_NOTE = "peak_GB = process RSS high-water mark (VmHWM), not an allocator peak"


# ----------------------------------------------------------------------------- measuring


def timer(device: torch.device, warmup: int, iters: int) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of fn over `iters` runs after `warmup` (CUDA events on a GPU)."""

    def run(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return run


class PeakMemory:
    """Peak GiB since reset(). CUDA: the caching allocator's max_memory_allocated (weights
    included, as in the calibration file). CPU on Linux: the process RSS high-water mark
    (VmHWM, reset through /proc/self/clear_refs), which includes the interpreter and
    libraries; None where it cannot be reset."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu_resettable = device.type != "cuda" and os.access("/proc/self/clear_refs", os.W_OK)
        self.note = "" if device.type == "cuda" else RSS_NOTE

    def reset(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.cpu_resettable:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)

    def read(self) -> Optional[float]:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GIB
        if not self.cpu_resettable:
            return None
        m = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        return int(m.group(1)) * 1024 / GIB if m else None


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


@dataclass
class Target:
    """One generator to profile and what the records say about it."""

    name: str  # the record's "model"
    policy: Any
    cond: Cond  # batch 1
    params_B: float
    tokens: int
    shape: str
    family: str  # "tiny-dit" or a diffusers family
    grad_ckpt: bool  # the module supports gradient checkpointing
    vae_name: Optional[str] = None
    vae_what: Optional[str] = None
    lora_targets: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


class Profiler:
    def __init__(self, device: torch.device, warmup: int, iters: int, log: Callable[[str], None] = print):
        self.device = device
        self.time = timer(device, warmup, iters)
        self.peak = PeakMemory(device)
        self.log = log
        self.device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.records: list[dict] = []

    def _emit(self, record: dict) -> None:
        record["device"] = self.device_name
        if self.peak.note and "peak_GB" in record:
            record["note"] = self.peak.note
        self.records.append(record)
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in record.items()
                 if k in ("model", "what", "batch", "grad_ckpt", "ms", "peak_GB", "ms_per_B_params", "h2d_GBps")}
        self.log(f"  {shown}")

    def _measure(self, fn: Callable[[], Any], label: str) -> Optional[tuple[float, Optional[float]]]:
        """(median ms, peak GiB) of fn, or None after an out-of-memory error."""
        try:
            self.peak.reset()
            ms = self.time(fn)
            return ms, self.peak.read()
        except (torch.cuda.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            self.log(f"  {label}: out of memory, skipped ({str(e).splitlines()[0][:120]})")
            return None
        finally:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _base(self, t: Target, what: str, batch: int) -> dict:
        return dict(model=t.name, params_B=t.params_B, tokens=t.tokens, shape=t.shape, what=what, batch=batch)

    def _inputs(self, t: Target, b: int):
        g = torch.Generator(device="cpu").manual_seed(b)
        x = torch.randn(b, *t.policy.latent_shape, generator=g).to(self.device)  # float32 (B, *latent)
        noise = torch.randn(x.shape, generator=g).to(self.device)
        sigma = torch.full((b,), SIGMA, device=self.device)
        return x, noise, sigma, cond_repeat(t.cond, b)

    # ---- the generator ------------------------------------------------------------

    def forward(self, t: Target, batches: list[int]) -> None:
        from digenrl.math import sde_step

        for b in batches:
            x, noise, sigma, cond = self._inputs(t, b)

            def step() -> None:
                with torch.no_grad():
                    v = t.policy.velocity(x, sigma, cond)
                    sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL, noise=noise)

            got = self._measure(step, f"forward batch {b}")
            if got is None:
                break
            self._emit(dict(self._base(t, "forward", b), ms=got[0], **_peak(got[1])))

    def train(self, t: Target, batches: list[int], grad_ckpt: bool, what: str = "fwd+bwd") -> None:
        from digenrl.math import grpo_loss, sde_step

        module = t.policy.module
        if grad_ckpt:
            module.enable_gradient_checkpointing()
        params = [p for p in module.parameters() if p.requires_grad]
        try:
            for b in batches:
                x, noise, sigma, cond = self._inputs(t, b)
                with torch.no_grad():
                    v = t.policy.velocity(x, sigma, cond)
                    old = sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL, noise=noise)
                del v
                advantages = torch.ones(b, device=self.device)

                def step() -> None:
                    for p in params:
                        p.grad = None
                    v = t.policy.velocity(x, sigma, cond)
                    new = sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL,
                                   prev_sample=old.prev_sample)
                    loss, _ = grpo_loss(new.log_prob, old.log_prob, advantages, clip_range=1e-4)
                    loss.backward()

                got = self._measure(step, f"{what} grad_ckpt={grad_ckpt} batch {b}")
                for p in params:
                    p.grad = None
                if got is None:
                    break
                self._emit(dict(self._base(t, what, b), grad_ckpt=grad_ckpt, ms=got[0], **_peak(got[1])))
        finally:
            if grad_ckpt:
                module.disable_gradient_checkpointing()

    def lora(self, t: Target, batches: list[int], rank: int, grad_ckpt_options: list[bool]) -> None:
        """LoRA on a frozen base, injected as build_policy does (run last: it changes the module)."""
        from digenrl.models.lora import LoraSpec, apply_lora

        t.policy.module.requires_grad_(False)
        apply_lora(t.policy.module, LoraSpec(rank, 2.0 * rank, t.lora_targets))
        for ckpt in grad_ckpt_options:
            self.train(t, batches, ckpt, what="fwd+bwd-frozen-base")

    def decode(self, t: Target, batches: list[int]) -> None:
        if getattr(t.policy, "vae", None) is None:
            self.log(f"  {t.name}: no VAE loaded, decode not measured")
            return
        for b in batches:
            latents = torch.randn(b, *t.policy.latent_shape, generator=torch.Generator().manual_seed(b)).to(self.device)
            got = self._measure(lambda: t.policy.decode(latents), f"decode batch {b}")
            if got is None:
                break
            vae_params = sum(p.numel() for p in t.policy.vae.decoder.parameters()) / 1e9
            self._emit(dict(model=t.vae_name, params_B=vae_params, shape=t.shape.split(",")[0], what=t.vae_what,
                            batch=b, ms=got[0], **_peak(got[1])))

    def text(self, t: Target, batches: list[int]) -> None:
        pipe = getattr(t.policy, "text_pipeline", None)
        if pipe is None:
            self.log(f"  {t.name}: no text encoders loaded, encode not measured")
            return
        n_tokens = int(t.cond["prompt_embeds"].shape[1]) if "prompt_embeds" in t.cond else 0
        params = sum(p.numel() for m in pipe.components.values() if isinstance(m, torch.nn.Module)
                     for p in m.parameters())
        for b in batches:
            prompts = [f"a photo of a cat, number {i}" for i in range(b)]
            got = self._measure(lambda: t.policy._encode_with_text_encoders(prompts), f"encode batch {b}")
            if got is None:
                break
            self._emit(dict(model=f"{t.name}-text", params_B=params / 1e9, tokens=n_tokens,
                            what=f"encode-{n_tokens}-tokens", batch=b, ms=got[0], **_peak(got[1])))

    # ---- the system ---------------------------------------------------------------

    def adamw(self, params_B: float) -> None:
        """One AdamW step over params_B billion fp32 parameters (one flat tensor: the fused
        kernel's best case, as in the calibration), reported per billion."""
        n = int(params_B * 1e9)
        p = torch.nn.Parameter(torch.zeros(n, device=self.device))
        p.grad = torch.full_like(p, 1e-3)
        try:
            opt, what = torch.optim.AdamW([p], lr=1e-4, fused=True), "adamw-fused-step-fp32"
        except (RuntimeError, ValueError):
            opt, what = torch.optim.AdamW([p], lr=1e-4, foreach=True), "adamw-foreach-step-fp32"
        got = self._measure(opt.step, "adamw")
        del opt, p
        if got is not None:
            self._emit(dict(what=what, params_B=n / 1e9, ms=got[0], ms_per_B_params=got[0] / (n / 1e9)))

    def pcie(self, gib: float = 1.0) -> None:
        if self.device.type != "cuda":
            self.log("  pcie: CPU device, not measured")
            return
        n = int(gib * GIB)
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device=self.device)
        h2d = self.time(lambda: dev.copy_(host, non_blocking=True))
        d2h = self.time(lambda: host.copy_(dev, non_blocking=True))
        del host, dev
        self._emit(dict(what="pcie", d2h_GBps=n / 1e9 / (d2h * 1e-3), h2d_GBps=n / 1e9 / (h2d * 1e-3)))


def _peak(gib: Optional[float]) -> dict:
    return {} if gib is None else {"peak_GB": gib}


# ----------------------------------------------------------------------------- targets


def cost_model_name(family: str, params_B: float) -> Optional[str]:
    """The digenrl.sim.catalogue.MODELS entry this family and size is (within 10% of its params)."""
    from digenrl.sim.catalogue import MODELS

    prefix = COST_MODEL_PREFIX.get(family)
    for name, spec in MODELS.items():
        if prefix and name.startswith(prefix) and abs(params_B / spec.params_B - 1.0) < 0.10:
            return name
    return None


def _tokens(latent_shape: tuple[int, ...], text: int) -> int:
    """Sequence length: 2x2 latent patches (x latent frames for video) + text tokens in the joint sequence."""
    *lead, h, w = latent_shape
    frames = lead[1] if len(lead) == 2 else 1
    return frames * (h // 2) * (w // 2) + text


def _finish_diffusers(policy, cond: Cond, family: str, name: Optional[str], tiny: bool,
                      log: Callable[[str], None]) -> Target:
    """The records' names, token count and shape string of a diffusers policy (see the module docstring)."""
    from digenrl.sim.catalogue import MODELS, Shape

    params_B = sum(p.numel() for p in policy.module.parameters()) / 1e9
    video = policy.output == "video"
    text = int(cond["prompt_embeds"].shape[1]) if JOINT_TEXT[family] else 0
    shape = Shape(policy.height, policy.width, policy.num_frames if video else 1)
    notes = []
    if name is None:
        known = cost_model_name(family, params_B)
        name = known or f"{family}-{params_B:.2f}b"
        if tiny:
            name = f"{known or family}-tiny"
        elif known and shape != MODELS[known].calib_shape:
            name = f"{known}@{shape.height}x{shape.width}" + (f"x{shape.frames}" if video else "")
            notes.append(f"shape differs from the cost model's calibration shape {MODELS[known].calib_shape}: "
                         f"records named {name!r}, which CostModel does not read")
        elif not known:
            notes.append(f"no cost-model entry for {family} at {params_B:.2f}B parameters: records named {name!r}")
    elif name in MODELS and shape != MODELS[name].calib_shape:
        notes.append(f"records named {name!r} but measured at {shape}; CostModel assumes {MODELS[name].calib_shape}")
    vae_name, vae_what = None, None
    if getattr(policy, "vae", None) is not None:
        calib = CALIB_VAES.get(family)
        if calib and (shape.height, shape.width, shape.frames) == calib[1] and not tiny:
            vae_name = calib[0]
        else:
            vae_name = f"{name}-vae"
        vae_what = (f"decode-{shape.frames}f-{shape.height}x{shape.width}" if video
                    else (f"decode-{shape.height}px" if shape.height == shape.width
                          else f"decode-{shape.height}x{shape.width}"))
    for n in notes:
        log(f"note: {n}")
    shape_str = f"{shape.frames} frames {shape.height}x{shape.width}" if video else \
        f"{shape.height}x{shape.width}, {text} text tokens"
    return Target(name, policy, cond, params_B, _tokens(policy.latent_shape, text), shape_str, family,
                  hasattr(policy.module, "enable_gradient_checkpointing"), vae_name, vae_what,
                  tuple(policy.default_lora_targets), notes)


def load_target(args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                log: Callable[[str], None] = print) -> Target:
    """The generator named by --model/--arch, --path / --random, --tiny."""
    model = args.model
    if model == "tiny-dit":
        from digenrl.models.tiny_dit import LORA_TARGETS, TinyDiT, TinyDiTConfig, TinyDiTPolicy

        if args.path:
            from digenrl.toy.pretrain import load_tiny_dit

            module = load_tiny_dit(Path(args.path))
        else:  # the weights do not change the cost: a random init of the toy architecture
            torch.manual_seed(0)
            module = TinyDiT(TinyDiTConfig())
        policy = TinyDiTPolicy(module.to(dtype), str(device))
        c = module.config
        tokens = (c.image_size // c.patch) ** 2 + c.max_tokens
        params_B = sum(p.numel() for p in module.parameters()) / 1e9
        shape = f"{c.image_size}x{c.image_size}, {c.max_tokens} text tokens"
        return Target(args.name or "tiny-dit", policy, policy.negative_cond(1), params_B, tokens, shape, "tiny-dit",
                      False, lora_targets=LORA_TARGETS)
    explicit_shape = args.height or args.width or args.frames
    if args.random:
        from digenrl.models.diffusers_adapters.configs import ARCHS, build_random

        if model not in ARCHS:
            raise SystemExit(f"--random builds only {', '.join(ARCHS)} (inline configs); for {model} pass --path")
        opts = {k: v for k, v in (("height", args.height), ("width", args.width)) if v}
        policy, cond = build_random(model, args.tiny, device, dtype, vae=True, **opts)
        return _finish_diffusers(policy, cond, model, args.name, args.tiny, log)
    if not args.path:
        raise SystemExit(f"--model {model}: pass --path <diffusers pipeline folder> (or --random for sd3/flux)")
    from digenrl.models.diffusers_adapters import load_policy
    from digenrl.sim.catalogue import MODELS

    # default shape: the cost model's calibration shape for this family, if the size is known
    shape_opts = {}
    if not explicit_shape:
        prefix = COST_MODEL_PREFIX[model]
        specs = [m for n, m in MODELS.items() if n.startswith(prefix)]
        if len(specs) == 1 or (specs and all(s.calib_shape == specs[0].calib_shape for s in specs)):
            s = specs[0].calib_shape
            shape_opts = dict(height=s.height, width=s.width) | (dict(frames=s.frames) if s.frames > 1 else {})
    else:
        shape_opts = {k: v for k, v in (("height", args.height), ("width", args.width), ("frames", args.frames)) if v}
    # with a prompt cache the text encoders are not loaded (a trainer's setup; no encode timing)
    policy = load_policy(model, args.path, device=str(device), dtype=dtype, train="full",
                         prompt_cache=args.prompt_cache, text_encoders=args.prompt_cache is None, **shape_opts)
    cond = {k: v[:1] for k, v in policy.encode_prompts(["a photo of a cat"]).items()}
    return _finish_diffusers(policy, cond, model, args.name, args.tiny, log)


# ----------------------------------------------------------------------------- files


def record_key(r: dict) -> tuple[str, str]:
    """Lines that one profile run replaces as a set: same model (or none) and same measurement."""
    return (r.get("model", ""), r["what"])


def merge_records(base: list[dict], new: list[dict]) -> list[dict]:
    """base with every (model, what) that `new` measured replaced by new's lines."""
    replaced = {record_key(r) for r in new}
    return [r for r in base if record_key(r) not in replaced] + list(new)


def load_calibration_file(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def check_loadable(path: Path, names: set[str]) -> tuple[bool, str]:
    """Does CostModel load the file, and which profiled models does it fit from it?"""
    from digenrl.sim.costs import CostModel

    try:
        cm = CostModel(calibration=path)
    except Exception as e:  # noqa: BLE001 - report whatever the cost model rejects
        return False, f"CostModel({str(path)!r}) fails: {type(e).__name__}: {e} (try --fill-from-h200)"
    used = sorted({m for m, _ in cm.table if m in names})
    unused = sorted(names - set(used))
    msg = f"CostModel({str(path)!r}) loads; fitted from your measurements: {used or 'none'}"
    if unused:
        msg += f"; not read by the cost model (not one of its models at its calibration shape): {unused}"
    return True, msg


# ----------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="digenrl profile", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--model", "--arch", dest="model", required=True, choices=("tiny-dit",) + DIFFUSERS_FAMILIES,
                    help="tiny-dit, or a diffusers family (with --path, or --random for sd3/flux)")
    ap.add_argument("--path", default=None, help="local diffusers pipeline folder (tiny-dit: a saved toy model)")
    ap.add_argument("--random", action="store_true", help="random weights from the inline configs (sd3, flux)")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke test; with --random)")
    ap.add_argument("--name", default=None, help="the records' model name (default: the cost model's name)")
    ap.add_argument("--batches", default="1,2,4", help="forward batch sizes")
    ap.add_argument("--train-batches", default="1,2", help="fwd+bwd batch sizes")
    ap.add_argument("--decode-batches", default=None, help="VAE decode batch sizes (default 1,4; video 1)")
    ap.add_argument("--what", default=",".join(MEASUREMENTS), help=f"subset of {','.join(MEASUREMENTS)}")
    ap.add_argument("--lora-rank", type=int, default=32, help="rank for fwd+bwd-frozen-base")
    ap.add_argument("--adamw-params-B", type=float, default=None,
                    help="fp32 parameters (billions) for the AdamW step (default 1 on CUDA, 0.01 on CPU)")
    ap.add_argument("--height", type=int, default=0)
    ap.add_argument("--width", type=int, default=0)
    ap.add_argument("--frames", type=int, default=0)
    ap.add_argument("--prompt-cache", default=None,
                    help="prompt cache folder holding 'a photo of a cat' (text encoders then not loaded)")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--out", default="profile.jsonl", help="JSONL to write (merged into if it exists)")
    ap.add_argument("--fill-from-h200", action="store_true",
                    help="complete the file from the packaged H200 calibration so CostModel can load it")
    return ap


def _ints(text: str, flag: str, ap: argparse.ArgumentParser) -> list[int]:
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ap.error(f"{flag}: expected comma-separated integers, got {text!r}")
    if not out or min(out) < 1:
        ap.error(f"{flag}: expected batch sizes >= 1, got {text!r}")
    return sorted(set(out))


def profile_main(argv: Optional[list[str]] = None) -> int:
    """Entry point of `digenrl profile` (see the module docstring); returns the exit code."""
    ap = build_parser()
    args = ap.parse_args(argv)
    what = [w for w in args.what.split(",") if w]
    if unknown := [w for w in what if w not in MEASUREMENTS]:
        ap.error(f"--what: unknown {unknown}; allowed: {', '.join(MEASUREMENTS)}")
    if args.random and args.path:
        ap.error("--random and --path exclude each other")
    if args.tiny and not args.random and args.model != "tiny-dit":
        ap.error("--tiny goes with --random (tiny inline configs)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and args.random and not args.tiny:
        ap.error("full-size random architectures need a GPU here; use --tiny for a CPU smoke test")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    small = args.tiny or args.model == "tiny-dit"
    warmup = args.warmup if args.warmup is not None else (1 if small else 3)
    iters = args.iters if args.iters is not None else (3 if small else 7)
    batches = _ints(args.batches, "--batches", ap)
    train_batches = _ints(args.train_batches, "--train-batches", ap)

    print(f"digenrl profile: model={args.model} device={device} dtype={str(dtype)[6:]} torch={torch.__version__}",
          flush=True)
    prof = Profiler(device, warmup, iters)
    target = None
    if {"forward", "train", "lora", "vae", "text"} & set(what):
        target = load_target(args, device, dtype)
        print(f"{target.name}: {target.params_B:.3f}B parameters, {target.tokens} tokens ({target.shape})", flush=True)
        if "forward" in what:
            prof.forward(target, batches)
        ckpt_options = [False, True] if target.grad_ckpt else [False]
        if not target.grad_ckpt:
            print(f"  {target.name}: no gradient checkpointing in this module, fwd+bwd measured without")
        if "train" in what:
            for ckpt in ckpt_options:
                prof.train(target, train_batches, ckpt)
        if "vae" in what:
            video = getattr(target.policy, "output", "image") == "video"
            prof.decode(target, _ints(args.decode_batches or ("1" if video else "1,4"), "--decode-batches", ap))
        if "text" in what and target.family != "tiny-dit":
            prof.text(target, [1, 8] if not small else [1, 2])
        if "lora" in what and args.lora_rank > 0:  # last: it injects adapters into the module
            prof.lora(target, train_batches, args.lora_rank, ckpt_options)
        del target
        gc.collect()
    if "adamw" in what:
        prof.adamw(args.adamw_params_B or (1.0 if device.type == "cuda" else (1e-3 if small else 1e-2)))
    if "pcie" in what:
        prof.pcie()

    out = Path(args.out)
    base = []
    if args.fill_from_h200:
        from digenrl.sim.calibration import load_calibration

        base = load_calibration()
    if out.exists():
        base = merge_records(base, load_calibration_file(out))
    records = merge_records(base, prof.records)
    write_jsonl(out, records)
    print(f"wrote {len(prof.records)} measurement(s) to {out} ({len(records)} lines in all)")
    _, msg = check_loadable(out, {r["model"] for r in prof.records if "model" in r})
    print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(profile_main())

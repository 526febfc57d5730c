"""`digenrl profile`: measure on your own hardware what the cost model is calibrated from.

Writes JSONL lines in the format of `digenrl/sim/calibration/h200.jsonl` (keys model,
params_B, tokens, shape, what, batch, grad_ckpt, ms, peak_GB, device):

    forward                one sampler step (digenrl.rollout denoise_step: velocity + SDE
                           step + noise draw), no grad, per batch
    fwd+bwd                one trained step through Learner.accumulate (velocity + log-prob
                           + GRPO loss + backward), full fine-tune, with and without
                           gradient checkpointing
    fwd+bwd-packed         TSP's packed pass (learner.passes): batch = (sample, step) pairs, half
                           the samples at two timesteps, one forward + backward; the cost model
                           prices it as fwd+bwd at that batch, these lines check it
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
import sys
from pathlib import Path
from typing import Optional

import torch

from digenrl.profile.calibration_io import check_loadable, merge_into_file
from digenrl.profile.measure import Profiler
from digenrl.profile.targets import DIFFUSERS_FAMILIES, load_target
from digenrl.profile.workload import cli_workload

MEASUREMENTS = ("forward", "train", "packed", "lora", "vae", "text", "adamw", "pcie")


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
    work = cli_workload()
    target = None
    if {"forward", "train", "packed", "lora", "vae", "text"} & set(what):
        target = load_target(args, device, dtype)
        print(f"{target.name}: {target.params_B:.3f}B parameters, {target.tokens} tokens ({target.shape})", flush=True)
        if "forward" in what:
            prof.forward(target, batches, work)
        ckpt_options = [False, True] if target.grad_ckpt else [False]
        if not target.grad_ckpt:
            print(f"  {target.name}: no gradient checkpointing in this module, fwd+bwd measured without")
        if "train" in what:
            for ckpt in ckpt_options:
                prof.train(target, train_batches, ckpt, work)
        if "packed" in what:  # TSP's packed pass: b (sample, step) pairs at two timesteps
            prof.packed(target, train_batches)
        if "vae" in what:
            video = getattr(target.policy, "output", "image") == "video"
            prof.decode(target, _ints(args.decode_batches or ("1" if video else "1,4"), "--decode-batches", ap))
        if "text" in what and target.family != "tiny-dit":
            prof.text(target, [1, 8] if not small else [1, 2])
        if "lora" in what and args.lora_rank > 0:  # last: it injects adapters into the module
            prof.lora(target, train_batches, args.lora_rank, ckpt_options, work)
        del target
        gc.collect()
    if "adamw" in what:
        prof.adamw(args.adamw_params_B or (1.0 if device.type == "cuda" else (1e-3 if small else 1e-2)))
    if "pcie" in what:
        prof.pcie()

    out = Path(args.out)
    records = merge_into_file(out, prof.records, fill_from_h200=args.fill_from_h200)
    print(f"wrote {len(prof.records)} measurement(s) to {out} ({len(records)} lines in all)")
    _, msg = check_loadable(out, {r["model"] for r in prof.records if "model" in r})
    print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(profile_main())

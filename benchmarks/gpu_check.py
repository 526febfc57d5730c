"""GPU check of the diffusers adapters: overhead vs bare diffusers, and ratio == 1 in bf16.

Builds SD3.5-medium (512x512) and FLUX.1-dev (1024x1024) architectures with random
weights in bf16 from their published configs (inline in
digenrl/models/diffusers_adapters/configs.py; nothing is downloaded), batch 1, full
fine-tune, and measures with CUDA events (warmup, median):

    rollout step   adapter: velocity + sde_step (flow-sde, log-prob)  vs  bare transformer forward
    training step  adapter: velocity + sde_step log-prob + GRPO loss + backward
                                                                      vs  bare forward + backward
    ratio == 1     logp recomputed with grad equals the recorded (no_grad) logp bit for bit

Target: adapter overhead at most 10% on both. Each model is independent: an OOM or error
is recorded and the next model runs.

    python benchmarks/gpu_check.py --models sd3,flux --json gpu_check.json
    python benchmarks/gpu_check.py --tiny          # tiny configs, runs on CPU (smoke test)
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from digenrl.math import grpo_loss, sde_step  # noqa: E402
from digenrl.models.diffusers_adapters.configs import ARCHS as MODELS  # noqa: E402
from digenrl.models.diffusers_adapters.configs import build_random  # noqa: E402
from digenrl.models.diffusers_adapters.packing import flux_image_ids, pack_2x2  # noqa: E402
from digenrl.profile.timing import timer  # noqa: E402

NOISE_LEVEL = 0.7
SIGMA, SIGMA_NEXT = 0.8, 0.7


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype):
    """(policy, cond, bare_kwargs): the adapter and the same inputs in the transformer's own layout."""
    policy, cond = build_random(name, tiny, device, dtype)
    text_len = cond["prompt_embeds"].shape[1]
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(1, *policy.latent_shape, generator=g).to(device)
    xm = x.to(dtype)
    if name == "sd3":
        bare = dict(hidden_states=xm, timestep=torch.full((1,), SIGMA * 1000.0, device=device),
                    encoder_hidden_states=cond["prompt_embeds"], pooled_projections=cond["pooled_prompt_embeds"],
                    return_dict=False)
    else:
        h, w = policy.latent_shape[1:]
        bare = dict(hidden_states=pack_2x2(xm), timestep=torch.full((1,), SIGMA, device=device),
                    guidance=cond.get("guidance"), pooled_projections=cond["pooled_prompt_embeds"],
                    encoder_hidden_states=cond["prompt_embeds"],
                    txt_ids=torch.zeros(text_len, 3, device=device, dtype=dtype),
                    img_ids=flux_image_ids(h, w, device, dtype), return_dict=False)
    return policy, cond, x, bare


def check_model(name: str, tiny: bool, device: torch.device, dtype: torch.dtype, warmup: int, iters: int) -> dict:
    policy, cond, x, bare = build(name, tiny, device, dtype)
    module = policy.module
    params = sum(p.numel() for p in module.parameters())
    sigma = torch.full((1,), SIGMA, device=device)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(device)

    def zero_grads() -> None:
        for p in module.parameters():
            p.grad = None

    # ratio == 1: the rollout's logp (no grad) and the trainer's recomputation (grad) agree exactly
    with torch.no_grad():
        v = policy.velocity(x, sigma, cond)
        rec = sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL, noise=noise)
    v = policy.velocity(x, sigma, cond)
    re = sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL, prev_sample=rec.prev_sample)
    ratio_exact = bool(torch.equal(re.log_prob.detach(), rec.log_prob))
    logp_diff = float((re.log_prob.detach() - rec.log_prob).abs().max())
    del v, re
    zero_grads()
    advantages = torch.ones(1, device=device)

    def bare_forward() -> None:
        with torch.no_grad():
            module(**bare)

    def adapter_rollout() -> None:
        with torch.no_grad():
            v = policy.velocity(x, sigma, cond)
            sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL, noise=noise)

    def bare_train() -> None:
        zero_grads()
        out = module(**bare)[0]
        out.float().square().mean().backward()

    def adapter_train() -> None:
        zero_grads()
        v = policy.velocity(x, sigma, cond)
        out = sde_step(x, v, SIGMA, SIGMA_NEXT, kind="flow-sde", noise_level=NOISE_LEVEL, prev_sample=rec.prev_sample)
        loss, _ = grpo_loss(out.log_prob, rec.log_prob, advantages, clip_range=1e-4)
        loss.backward()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ms = {}
    # interleave bare and adapter so clock/thermal drift hits both alike
    for key, fn in (("bare_fwd", bare_forward), ("adapter_rollout", adapter_rollout),
                    ("bare_fwd_bwd", bare_train), ("adapter_train", adapter_train)):
        ms[key] = timer(device, warmup, iters)(fn)
    zero_grads()
    return {
        "model": name + ("-tiny" if tiny else ""),
        "params_B": params / 1e9,
        "latent_shape": list(policy.latent_shape),
        "dtype": str(dtype).replace("torch.", ""),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **{f"{k}_ms": v for k, v in ms.items()},
        "rollout_overhead_pct": 100.0 * (ms["adapter_rollout"] / ms["bare_fwd"] - 1.0),
        "train_overhead_pct": 100.0 * (ms["adapter_train"] / ms["bare_fwd_bwd"] - 1.0),
        "ratio_exact": ratio_exact,
        "logp_max_abs_diff": logp_diff,
        "peak_GB": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


def print_table(rows: list[dict]) -> None:
    head = (f"{'model':<12}{'params':>8}{'fwd':>9}{'rollout':>9}{'ovh%':>7}{'fwd+bwd':>9}{'train':>9}{'ovh%':>7}"
            f"{'ratio==1':>10}{'peakGB':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<12}  ERROR: {r['error']}")
            continue
        peak = f"{r['peak_GB']:.1f}" if r["peak_GB"] is not None else "-"
        print(f"{r['model']:<12}{r['params_B']:>7.2f}B{r['bare_fwd_ms']:>9.1f}{r['adapter_rollout_ms']:>9.1f}"
              f"{r['rollout_overhead_pct']:>7.1f}{r['bare_fwd_bwd_ms']:>9.1f}{r['adapter_train_ms']:>9.1f}"
              f"{r['train_overhead_pct']:>7.1f}{str(r['ratio_exact']):>10}{peak:>8}")
    print("(times: median ms per step, batch 1; target overhead <= 10%)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="sd3,flux", help="comma-separated, from: " + ",".join(MODELS))
    ap.add_argument("--json", default=None, help="write the results (a list of records) here")
    ap.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke test)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; allowed: {', '.join(MODELS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.tiny:
        ap.error("no CUDA device: the real-size check needs a GPU (use --tiny for a CPU smoke test)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
    iters = args.iters if args.iters is not None else (2 if args.tiny else 7)
    print(f"gpu_check: device={device} dtype={dtype} torch={torch.__version__} models={names} tiny={args.tiny}",
          flush=True)

    rows = []
    for name in names:
        t0 = time.perf_counter()
        try:
            rows.append(check_model(name, args.tiny, device, dtype, warmup, iters))
        except torch.cuda.OutOfMemoryError as e:
            rows.append({"model": name, "error": f"OOM: {str(e).splitlines()[0]}"})
        except Exception as e:  # keep going: one model's failure must not hide the others' numbers
            traceback.print_exc()
            rows.append({"model": name, "error": f"{type(e).__name__}: {e}"})
        rows[-1]["wall_s"] = time.perf_counter() - t0
        print(f"  {name}: done in {rows[-1]['wall_s']:.1f}s", flush=True)
        gc.collect()  # the failed model's tensors go before the next one is built
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all("error" not in r and r["ratio_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

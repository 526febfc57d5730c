"""Calibration: measured lines (calibration/h200.jsonl) -> one LinearFit per (model, op).

    records (load_calibration)  --fit_table-->  {(model, op): LinearFit}   H200 seconds / GiB
                                                  at the model's calibration shape

Ops: forward, train, train_ckpt, lora_train(_ckpt) (seconds per step); act_forward,
act_train(_ckpt) (activation GiB); VAE decode / decode_mem and t5xxl encode. Nothing here
moves a number to another device, batch shape or token count: that is the time queries'
job (costs.py) and the memory model's (memory.py). Kept apart from them because it is the
only code that reads measurements, and `digenrl profile` writes files for it.

The batch fit. One denoising step (or one training step) on a batch of b samples takes
fixed + per_sample * b: the fixed part is the weights read once, kernel launches and
Python; the per-sample part is the FLOPs. Least squares over the measured batch sizes,
with fixed >= 0 and, for training, per_sample >= k * (forward per_sample), k = 3 without
and 4 with gradient checkpointing (backward = 2 forwards; checkpointing recomputes one):
measured wan2.1 ratios are 3.06 / 4.07, so the floor only bites where a point is off
(qwen-image-20b ckpt batch 1, see FIT_NOTES). A single measured point gets the floor as
slope and the rest as fixed.

The FLOP floor. A forward's per-sample slope is at least its FLOPs at the best rate any
forward in the file reached (best_forward_flops). Launch-bound measurements (sd3.5-medium:
76.5 / 80.4 / 81.3 ms at batch 1 / 2 / 4, i.e. 1.6 ms per extra sample, 1,500 TFLOP/s at the
margin, above the H200's peak) otherwise extrapolate to impossible speeds at the batch sizes
the recipes use (8-18 rows); with the floor that slope is 5.0 ms (2.44 TFLOP at 486 TFLOP/s)
and the training floors follow from it.

Memory in GiB (2**30 B): torch and the file's `peak_GB` use GiB (FLUX's forward peak,
22.69, is below its bf16 weights in decimal GB, 23.8, so the file cannot be decimal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from digenrl.sim.catalogue import BYTES_WEIGHT, GIB, MODELS, MS, forward_flops, get_model, sample_flops, tokens_for


@dataclass(frozen=True)
class LinearFit:
    """y(b) = fixed + per_sample * b, at the model's calibration shape, on the H200."""

    fixed: float
    per_sample: float
    points: tuple[tuple[int, float], ...] = ()  # (batch, measured y)
    estimated: bool = False  # no measurement behind it at all (derived or scaled)
    note: str = ""

    def __call__(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch


def fit_linear(points: list[tuple[int, float]], min_slope: float = 0.0, note: str = "",
               single: str = "floor") -> LinearFit:
    """Least-squares fixed + slope * b with fixed >= 0 and slope >= min_slope.

    One point: single="floor" takes min_slope as the slope and the rest as fixed (times);
    single="origin" puts it all per sample (memory: the pessimistic reading).
    """
    bs = [float(b) for b, _ in points]
    ys = [float(y) for _, y in points]
    n = len(points)
    if n == 1:
        slope = ys[0] / bs[0] if single == "origin" else min(max(min_slope, 0.0), ys[0] / bs[0])
        return LinearFit(ys[0] - slope * bs[0], slope, tuple(points), False, note)
    mb, my = sum(bs) / n, sum(ys) / n
    sbb = sum((b - mb) ** 2 for b in bs)
    slope = sum((b - mb) * (y - my) for b, y in zip(bs, ys)) / sbb if sbb > 0 else 0.0
    slope = max(slope, min_slope)
    fixed = my - slope * mb
    if fixed < 0:  # through the origin instead
        fixed = 0.0
        slope = max(min_slope, sum(b * y for b, y in zip(bs, ys)) / sum(b * b for b in bs))
    return LinearFit(fixed, slope, tuple(points), False, note)


TRAIN_SLOPE_FLOOR = {False: 3.0, True: 4.0}  # x forward per-sample, by grad_ckpt
# Training without checkpointing not measured: model -> same-family model whose activations scale.
DERIVED_NO_CKPT = {"wan2.1-14b": "wan2.1-1.3b"}

FIT_NOTES = {
    ("qwen-image-20b", "train_ckpt"): (
        "batch 1 (1342 ms) is 1.82x the no-ckpt batch 1; checkpointing costs 1.29-1.35x in every "
        "other model, and batch 2 (1579 ms, 790/sample) is consistent. The FLOP floor (4 x forward "
        "per-sample) sets the slope; the fit misses batch 1 by -18% and batch 2 by +15%."
    ),
    ("sd3.5-medium", "forward"): (
        "launch-bound (76.5 / 80.4 / 81.3 ms at batch 1 / 2 / 4); the FLOP floor sets the slope at 5.0 ms "
        "per sample; the fit misses batch 1 by -5% and batch 4 by +8%."
    ),
}


def _default_calibration() -> Path:
    return Path(str(resources.files("digenrl.sim") / "calibration" / "h200.jsonl"))


def load_calibration(path: str | Path | None = None) -> list[dict]:
    """The calibration records (one dict per JSONL line); default: the packaged H200 file."""
    p = Path(path) if path else _default_calibration()
    with open(p) as f:
        return [json.loads(line) for line in f if line.strip()]


def adamw_ms_per_B(records: list[dict]) -> float:
    """Measured fused AdamW step, milliseconds per billion parameters (fp32 master + moments)."""
    return next(r["ms_per_B_params"] for r in records if r.get("what") == "adamw-fused-step-fp32")


def _points(records: list[dict], model: str, what: str, grad_ckpt: bool | None = None,
            key: str = "ms") -> list[tuple[int, float]]:
    """(batch, record[key]) of every record of (model, what[, grad_ckpt]), sorted by batch."""
    pts = []
    for r in records:
        if r.get("model") != model or r.get("what") != what:
            continue
        if grad_ckpt is not None and bool(r.get("grad_ckpt")) != grad_ckpt:
            continue
        if key in r:
            pts.append((int(r["batch"]), float(r[key])))
    return sorted(pts)


def best_forward_flops(records: list[dict]) -> float:
    """The highest FLOP/s any measured forward reached (batch * forward_flops / time): the rate
    no per-sample slope may beat. 486 TFLOP/s (wan2.1-14b) in the packaged file."""
    return max(int(r["batch"]) * forward_flops(r["model"], int(r["tokens"])) / (float(r["ms"]) * MS)
               for r in records if r.get("what") == "forward" and r.get("model") in MODELS and "tokens" in r)


def fit_table(records: list[dict]) -> dict:
    """{(model, op): LinearFit} from calibration records (see the module doc for the ops)."""
    f: dict = {}
    best = best_forward_flops(records)
    for name, m in MODELS.items():
        if m.scaled_from or not _points(records, name, "forward"):
            continue
        w_gib = BYTES_WEIGHT * m.params_B * 1e9 / GIB
        f[name, "forward"] = fit_linear([(b, t * MS) for b, t in _points(records, name, "forward")],
                                        forward_flops(m, tokens_for(m)) / best, FIT_NOTES.get((name, "forward"), ""))
        f[name, "act_forward"] = fit_linear(  # peak minus bf16 weights
            [(b, max(0.0, p - w_gib)) for b, p in _points(records, name, "forward", key="peak_GB")],
            single="origin")
        fwd_per = f[name, "forward"].per_sample
        for ckpt in (False, True):
            op = "train_ckpt" if ckpt else "train"
            if pts := _points(records, name, "fwd+bwd", ckpt):
                f[name, op] = fit_linear([(b, t * MS) for b, t in pts], TRAIN_SLOPE_FLOOR[ckpt] * fwd_per,
                                         FIT_NOTES.get((name, op), ""))
                mem = _points(records, name, "fwd+bwd", ckpt, key="peak_GB")  # bf16 weights + grads + activations
                f[name, "act_" + op] = fit_linear([(b, max(0.0, p - 2 * w_gib)) for b, p in mem], single="origin")
            if lora := _points(records, name, "fwd+bwd-frozen-base", ckpt):
                f[name, "lora_" + op] = fit_linear([(b, t * MS) for b, t in lora])
    # wan2.1-14b without checkpointing was not measured (it cannot fit: ~200 GiB of activations
    # per sample). Time: 3 forwards (the FLOP rule). Activations: wan2.1-1.3b's scaled by
    # hidden * layers (activation bytes per token; same tokens).
    for name, src in DERIVED_NO_CKPT.items():
        fw = f[name, "forward"]
        f.setdefault((name, "train"), LinearFit(3 * fw.fixed, 3 * fw.per_sample, (), True, "3 x forward (no measurement)"))
        m, o, a = get_model(name), get_model(src), f[src, "act_train"]
        k = (m.hidden * m.layers * tokens_for(m)) / (o.hidden * o.layers * tokens_for(o))
        f.setdefault((name, "act_train"), LinearFit(a.fixed * k, a.per_sample * k, (), True, f"{src} x {k:.2f}"))
    for name, m in MODELS.items():
        if m.scaled_from:
            scale_model(f, name, m.scaled_from)
    # VAEs and the text encoder (per-sample scaling happens at query time).
    for calib in ("flux-vae", "wan-vae"):
        what = next(r["what"] for r in records if r.get("model") == calib)
        # one measured point (wan-vae): all of it per sample, so it scales with batch and frames
        f[calib, "decode"] = fit_linear([(b, t * MS) for b, t in _points(records, calib, what)], single="origin")
        f[calib, "decode_mem"] = fit_linear(_points(records, calib, what, key="peak_GB"), single="origin")
    f["t5xxl", "encode"] = fit_linear(
        [(b, t * MS) for b, t in _points(records, "t5-v1.1-xxl-encoder", "encode-512-tokens")])
    return f


def scale_model(table: dict, name: str, src: str) -> None:
    """No measurement: add `name`'s fits to `table`, scaled from `src`'s: per-sample work by
    forward FLOPs at the calibration shapes, fixed (weight reads) by parameter count,
    activations by hidden * layers * tokens."""
    m, s = get_model(name), get_model(src)
    k_flops = sample_flops(m) / sample_flops(s)
    k_params = m.active_B / s.active_B  # weights one forward reads (two experts: one)
    k_act = (m.hidden * m.layers * tokens_for(m)) / (s.hidden * s.layers * tokens_for(s))
    for (model, op), fit in list(table.items()):
        if model != src:
            continue
        k_per = k_act if op.startswith("act_") else k_flops
        k_fix = k_act if op.startswith("act_") else k_params
        table[name, op] = LinearFit(fit.fixed * k_fix, fit.per_sample * k_per, (), True,
                                    f"scaled from {src} (per-sample x {k_per:.2f}, fixed x {k_fix:.2f})")

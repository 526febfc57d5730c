"""GPU specs, and how a cost measured on the H200 moves to another GPU.

Every cost in `sim` starts as an H200 measurement (calibration/h200.jsonl). Moving it to
another GPU uses published peak specs only, with one rule (`scale_seconds`):

    t_dev = t_compute * (tflops_ref / tflops_dev)      # compute-bound part
          + t_memory  * (hbm_gbps_ref / hbm_gbps_dev)  # memory-bound part
          + t_host                                     # launch / Python overhead, unchanged

The caller says which part of a cost is which (costs.py: per-sample work is compute-bound,
reading the weights once per step is memory-bound, the rest of the fixed part is host
overhead). The rule assumes every GPU reaches the same fraction of its peak as the H200
did; GDDR parts (L40S, 4090, A10G) usually reach less, so costs on them are optimistic,
which flatters heterogeneous (cheap-rollout) configurations: treat those as upper bounds.
Any number that went through the rule carries `estimated=True`.

Specs: NVIDIA datasheets (dense bf16 tensor TFLOP/s with fp32 accumulate, i.e. without
2:4 sparsity; HBM bandwidth; NVLink total bidirectional bandwidth). Memory is GiB as
torch reports it (nvidia-smi MiB / 1024, approximate). Prices are estimates, see PRICES.
"""

from __future__ import annotations

from dataclasses import dataclass


class Cost(float):
    """A float (seconds, GiB, bytes) that remembers whether it was measured or estimated.

    It behaves as a plain float for the simulator; arithmetic drops the flags, so combine
    flagged numbers with `total` / `scaled` below.
    """

    estimated: bool
    source: str

    def __new__(cls, value: float, estimated: bool = False, source: str = "") -> "Cost":
        obj = super().__new__(cls, value)
        obj.estimated = bool(estimated)
        obj.source = source
        return obj

    def __repr__(self) -> str:
        flag = ", estimated" if self.estimated else ""
        return f"Cost({float(self):.6g}{flag})"

    def __reduce__(self):  # keep flags through pickle / copy (Ray, multiprocessing)
        return (Cost, (float(self), self.estimated, self.source))


def total(*parts: float, source: str = "") -> Cost:
    """Sum of costs; estimated if any part is."""
    est = any(getattr(p, "estimated", False) for p in parts)
    return Cost(sum(float(p) for p in parts), est, source)


def scaled(c: float, k: float, estimated: bool = False, source: str = "") -> Cost:
    """c * k, estimated if c was or if the factor k is itself an estimate."""
    return Cost(float(c) * k, estimated or getattr(c, "estimated", False), source or getattr(c, "source", ""))


@dataclass(frozen=True)
class Device:
    name: str
    bf16_tflops: float  # dense tensor-core bf16, fp32 accumulate
    hbm_gib: float  # usable device memory as torch reports it
    hbm_gbps: float  # memory bandwidth, GB/s
    nvlink_gbps: float  # NVLink total bidirectional GB/s per GPU; 0 = no NVLink
    pcie_gbps: float  # host<->device, GB/s each way (effective, pinned memory)
    usd_per_hour: float  # ESTIMATE, see PRICES
    note: str = ""


# Prices (USD per GPU-hour, on-demand) are ESTIMATES, not quotes: midpoints of the
# "specialty cloud" tier in the Mercatus cloud GPU price survey (May 2026; A100-80G
# $1.10-1.50, H100 $2.50-3.50, H200 $3.50-4.50), AWS list price for A10G (g5.xlarge
# $1.006/h, instance including CPUs), and community-cloud ranges for L40S / 4090 / L4 /
# B200 / H20 / RTX A6000 / RTX PRO 6000 (order of magnitude only). Use them for throughput-per-dollar comparisons,
# and re-run with your own prices before quoting a dollar figure.
PRICE_SOURCE = "estimate: public on-demand list prices 2025-2026 (Mercatus survey, AWS, community clouds)"

# PCIe: Gen5 x16 is 64 GB/s per direction on paper; the H200 calibration measured 55.3 / 55.1
# GB/s (d2h / h2d, pinned). Gen4 x16 parts get the same 86% efficiency of 32 GB/s = 27.5.
_GEN5, _GEN4 = 55.0, 27.5

DEVICES: dict[str, Device] = {
    d.name: d
    for d in [
        # The calibration device: H200 SXM, 141 GB HBM3e (nvidia-smi 143771 MiB), 4.8 TB/s.
        Device("H200", 989.0, 140.4, 4800.0, 900.0, _GEN5, 4.00, "calibration device"),
        Device("H100", 989.0, 79.6, 3350.0, 900.0, _GEN5, 3.00, "H100 SXM5 80GB"),
        # H800 SXM: the H100 die with NVLink capped at 400 GB/s (third-party spec pages: no NVIDIA
        # datasheet is public); same dense bf16 and 80 GB HBM3 at 3.35 TB/s. No H800 price was
        # found: the H100 estimate is used. Intra-node link: `nvlink-h800`.
        Device("H800", 989.0, 79.6, 3350.0, 400.0, _GEN5, 3.00, "H800 SXM 80GB (H100 die, NVLink 400 GB/s)"),
        Device("A100-80G", 312.0, 80.0, 2039.0, 600.0, _GEN4, 1.30, "A100 SXM4 80GB"),
        Device("L40S", 362.0, 45.0, 864.0, 0.0, _GEN4, 0.95, "Ada, 48 GB GDDR6, no NVLink"),
        Device("L4", 121.0, 22.5, 300.0, 0.0, _GEN4, 0.80, "Ada, 24 GB GDDR6, no NVLink"),
        Device("A10G", 70.0, 22.5, 600.0, 0.0, _GEN4, 1.01,
               "AWS A10G, 24 GB GDDR6; bf16 dense ~70 TFLOP/s (approximate, AWS publishes little)"),
        # GeForce halves tensor throughput with fp32 accumulate: 165, not 330.
        Device("RTX4090", 165.0, 24.0, 1008.0, 0.0, _GEN4, 0.60, "GeForce, 24 GB GDDR6X"),
        Device("B200", 2250.0, 179.0, 8000.0, 1800.0, _GEN5, 5.50, "Blackwell HGX B200"),
        Device("H20", 148.0, 95.6, 4000.0, 900.0, _GEN5, 1.50, "export Hopper, 96 GB"),
        # The paper's testbed A part. NVIDIA RTX A6000 data sheet: 48 GB GDDR6 with ECC,
        # 768 GB/s, PCI Express 4.0 x16, "Tensor performance 309.7 TFLOPS" with structured sparsity,
        # i.e. 154.8 dense FP16/BF16 tensor TFLOP/s; a professional card, so fp32 accumulate runs
        # at the full rate (GeForce halves it). NVLink is a 2-way bridge only (112.5 GB/s
        # bidirectional between a pair): no all-to-all NVLink in an 8-GPU node, so 0 here and
        # PCIe Gen4 between a node's GPUs (link `pcie4`). Memory: torch reports 47.54 GiB
        # (its OOM messages on this card). Price: community-cloud order of magnitude.
        Device("RTX-A6000", 154.8, 47.5, 768.0, 0.0, _GEN4, 0.50,
               "Ampere workstation, 48 GB GDDR6, PCIe Gen4, no NVLink switch"),
        # The paper's testbed C part. NVIDIA RTX PRO 6000 Blackwell (Server / Workstation
        # Edition, same GB202 with 188 SMs): 96 GB GDDR7 with ECC at 1792 GB/s, PCIe Gen5 x16, no
        # NVLink; "4000 AI TOPS" is FP4 with sparsity, i.e. 503.8 dense FP16/BF16 tensor TFLOP/s
        # with fp32 accumulate (1007.6 sparse; the product's spec tables). nvidia-smi reports
        # 97887 MiB (95.6 GiB). Price: community-cloud order of magnitude.
        Device("RTX-PRO-6000", 503.8, 95.6, 1792.0, 0.0, _GEN5, 1.80,
               "Blackwell workstation/server, 96 GB GDDR7, PCIe Gen5, no NVLink"),
    ]
}

REFERENCE = "H200"  # the device the calibration was measured on

# Spot (preemptible) defaults per device type: what a testbed pool's `spot: {}` takes for the
# keys it leaves out (testbed.Pool.spot; sched.preemption.SpotSpec). ESTIMATES, read 2026-12-02;
# docs/design/simulator.md ("Spot rollout pools") gives each source. Set your own for a quote.
#   price                   USD per GPU-hour. H100: AWS P5 spot ~$2.00-2.50 and GCP A3-High spot
#                           ~$2.25 per GPU-hour (costnimbus.com, "GPU cost management", March 2026):
#                           2.25. L40S: the GPU Markets daily spot fixing of 2026-04-18, $0.78 per
#                           GPU-hour over 9 venues (gpumarkets.dev, series l40s-spot). A100-80G:
#                           $0.86 spot (aiapiplaybook.com, "GPU cloud pricing 2026", 2026-01-15).
#   interruptions_per_hour  per worker. AWS's Spot Instance Advisor sorts instance types into
#                           buckets of the share interrupted per month (<5%, 5-10%, 10-15%, 15-20%,
#                           >20%); the top bucket's edge, 20% a month (720 h), is a Poisson rate of
#                           -ln(0.8) / 720 = 3.1e-4 per hour. GPU types are usually in the top
#                           buckets, so this is a lower estimate: plan with your own rate as well.
#   notice_s                120: AWS's two-minute interruption notice (EC2 user guide, "Spot
#                           Instance interruption notices"). GCP Spot VMs get 30 s (Compute Engine
#                           API, Scheduling.skipGuestOsShutdown): set notice_s: 30 there.
#   replace_s               600: an assumption, not a published figure (a new instance's boot,
#                           image pull and model load); null when nothing replaces a reclaimed worker.
SPOT_INTERRUPTIONS_PER_HOUR = 3.1e-4  # -ln(1 - 0.20) / 720
SPOT_NOTICE_S = 120.0
SPOT_REPLACE_S = 600.0
SPOT_PRICES = {"H100": 2.25, "L40S": 0.78, "A100-80G": 0.86}  # USD per GPU-hour, estimates (above)
SPOT_SOURCE = "estimate read 2026-12-02: spot price pages, AWS Spot Instance Advisor, AWS/GCP notice docs"


def get_device(name: str | Device) -> Device:
    """Device by name; the error lists the names that exist."""
    if isinstance(name, Device):
        return name
    try:
        return DEVICES[name]
    except KeyError:
        raise KeyError(f"unknown device {name!r}; allowed: {sorted(DEVICES)}") from None


def scale_seconds(
    t_compute: float,
    t_memory: float,
    t_host: float,
    device: str | Device,
    ref: str | Device = REFERENCE,
    source: str = "",
) -> Cost:
    """Move an H200 time, split into compute-bound / memory-bound / host parts, to `device`.

    On the reference device this is the plain sum (flagged estimated only if an input
    was); anywhere else it is flagged estimated.
    """
    dev, ref_dev = get_device(device), get_device(ref)
    t = (
        float(t_compute) * ref_dev.bf16_tflops / dev.bf16_tflops
        + float(t_memory) * ref_dev.hbm_gbps / dev.hbm_gbps
        + float(t_host)
    )
    est = dev.name != ref_dev.name or any(getattr(x, "estimated", False) for x in (t_compute, t_memory, t_host))
    return Cost(t, est, source)


def usd_per_hour(device: str | Device) -> Cost:
    return Cost(get_device(device).usd_per_hour, True, PRICE_SOURCE)

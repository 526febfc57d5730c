"""GPU check: peak memory per trainer rank while loading and at a training step, before and after
sharded loading, beside sim/memory.py (benchmarks/gpu_suite.py runs it; the CPU measurement of
the same thing over gloo is benchmarks/load_memory.py).

    python benchmarks/gpu_load_check.py                     # CUDA: FLUX.1-dev width, 2+2 blocks (~1.03B)
    python benchmarks/gpu_load_check.py --tiny --device cpu # the wiring, a tiny FLUX (gpu_suite --dry-run)

One GPU plays one rank of a gang of 1, 2 and 4 (torch's fake process group: FSDP2 shards exactly
as in a real gang, the collectives move no bytes, so the gathered parameters hold no real values;
the memory they take is real). For each gang, full fine-tune and LoRA (rank 32), whole and
sharded loading (benchmarks/load_memory.py's doc): torch.cuda.max_memory_allocated during the
load (from the checkpoint on the host into the device: the whole path moves its fp32 model to
the device, as cast_module does, then shards) and during one forward + backward + AdamW step
(bf16 compute, 256 image + 64 text tokens), rank 0 (it holds the largest shards). Beside them
sim/memory.py's load_gib and gang_rank_memory for the same shape (activations not included).

Prints one JSON line: {model, params, blocks, device, rows: [{gang, train, loader, load_gib,
sim_load_gib, step_gib, sim_step_gib, load_s, step_s}]}.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

GIB = 2.0**30
LORA_RANK = 32


def tiny_config() -> dict:
    """A FLUX transformer small enough for a CPU dry run (2 heads of 16)."""
    return dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
                num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
                axes_dims_rope=(4, 6, 6))


def measure(folder: Path, gang: int, lora: bool, loader: str, device: torch.device, tokens: tuple[int, int],
            step: bool) -> dict:
    """Rank 0 of a gang of `gang`: load, then (optionally) one training step; peaks in GiB."""
    import torch.distributed as dist
    from load_memory import build_module
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from digenrl.profile.timing import PeakMemory
    from digenrl.runtime.gang_rank import load_sharded

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=gang)
    try:
        mesh = init_device_mesh(device.type, (gang,))
        peak = PeakMemory(device)
        peak.reset()
        start = peak.read()  # (CPU: the process's RSS; CUDA: 0 between rows)
        t0 = time.time()
        module, files = build_module(folder, loader, lora, device.type)
        load_sharded(SimpleNamespace(module=module, weight_files=files), mesh, dtype="bfloat16", lora=lora,
                     device=device.type)
        if device.type == "cuda":
            torch.cuda.synchronize()
        row = {"load_gib": peak.read() - start, "load_s": time.time() - t0}
        if step:
            cfg = module.config
            img, txt = tokens
            params = [p for p in module.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=1e-5)
            x = torch.randn(1, img, cfg.in_channels, device=device)
            text = torch.randn(1, txt, cfg.joint_attention_dim, device=device)
            pooled = torch.randn(1, cfg.pooled_projection_dim, device=device)
            t0 = time.time()
            v = module(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                       timestep=torch.tensor([0.5], device=device), img_ids=torch.zeros(img, 3, device=device),
                       txt_ids=torch.zeros(txt, 3, device=device), guidance=torch.tensor([3.5], device=device),
                       return_dict=False)[0]
            v.float().pow(2).mean().backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            row.update(step_gib=peak.read() - start, step_s=time.time() - t0)
        del module, files
        return row
    finally:
        dist.destroy_process_group()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    from diffusers import FluxTransformer2DModel

    from digenrl.models.diffusers_adapters.base import DEFAULT_LORA_TARGETS
    from digenrl.models.empty import params_on_meta
    from digenrl.models.lora import LoraSpec, apply_lora
    from digenrl.sim.memory import gang_rank_memory, load_gib
    from load_memory import flux_config, write_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny FLUX (the suite's dry run)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gangs", default="1,2,4")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    config = tiny_config() if a.tiny else flux_config(2, 2)
    tokens = (16, 8) if a.tiny else (256, 64)
    with tempfile.TemporaryDirectory(prefix="gpu_load_check_") as tmp:
        folder = Path(tmp) / "transformer"
        n, blocks = write_checkpoint(folder, config["num_layers"], config["num_single_layers"], config)
        with params_on_meta():
            probe = FluxTransformer2DModel(**config)
        apply_lora(probe, LoraSpec(LORA_RANK, 2.0 * LORA_RANK, DEFAULT_LORA_TARGETS))
        adapters = sum(p.numel() for name, p in probe.named_parameters() if "lora_" in name)
        rows = []
        for gang in [int(g) for g in a.gangs.split(",")]:
            for lora in (False, True):
                for loader in ("whole", "sharded"):
                    ad = adapters if lora else 0.0
                    held, transient = load_gib(n, blocks, gang, adapters=ad, loader=loader)
                    row = {"gang": gang, "train": "lora" if lora else "full", "loader": loader,
                           **measure(folder, gang, lora, loader, device, tokens, step=loader == "sharded"),
                           "sim_load_gib": held + transient,
                           "sim_step_gib": gang_rank_memory(n, blocks, gang, adapters=ad).resident}
                    rows.append(row)
                    print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    print(json.dumps({"model": "flux.1-dev width, tiny" if a.tiny else "flux.1-dev width, 2+2 blocks", "params": n,
                      "blocks": blocks, "device": str(device), "rows": rows}))


if __name__ == "__main__":
    main()

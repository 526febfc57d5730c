"""Peak memory per trainer rank while loading and training a real architecture, before and after
sharded loading, beside sim/memory.py's prediction for the same shape.

    python benchmarks/load_memory.py [--double 2 --single 2] [--gangs 1,2,4] [--no-step]

The model: FLUX.1-dev's transformer at its real width (3072 = 24 heads x 128, text 4096,
in_channels 64, guidance embedding) with 2 double- and 2 single-stream blocks instead of 19 and
38, about 1.03B parameters, random bf16 weights written to a temporary diffusers folder
(transformer/config.json + safetensors shards, one per block, as a hub checkpoint ships them).

For each gang size and each of full fine-tune / LoRA (rank 32 on the attention projections), one
process per rank over gloo on this CPU, each rank:

    before  load: the whole transformer in fp32 (from_pretrained), rank 0's state broadcast,
            the LoRA base cast to bf16, FSDP2 sharding (gang_rank.load_sharded on a whole module)
    after   load: built on the meta device, sharded, each rank's rows read by slice
            (runtime/sharded_load.py; load_sharded on an empty module)
    step    (LoRA only) one forward + backward over 64 image + 16 text tokens in bf16 compute
            (FSDP MixedPrecisionPolicy, as model.dtype=bfloat16 runs) and one AdamW step

and reports the RSS high-water mark (VmHWM, reset through /proc/self/clear_refs:
digenrl.profile.timing.PeakMemory) above the rank's RSS just before the phase (the interpreter,
torch and diffusers: "base"), the largest over the gang's ranks. A full fine-tune's training step
(16 B per parameter / gang of state) is not run: 16 GiB at a gang of 1 does not fit beside the
other work on the 2-core, 23 GiB machine this was written on.

sim columns: sim/memory.py for the same shape (params, 4 blocks): load = load_gib's held +
transient (the sharded loader's bound: shards + one block in fp32; the whole path's: the fp32
model + its shards); step = gang_rank_memory's resident weights + gradients + AdamW state (the
activations at these 80 tokens are not in it). alloc: the step's allocator peak above the step's
start (torch.profiler's CPU memory events: live tensors only, no retained pages), against gath,
the gathered bf16 blocks sim charges a rank at a gang > 1 (memory.GANG_GATHERED_BLOCKS x the mean
block).

A row whose predicted gang total does not fit in 70% of MemAvailable runs its ranks one at a time
instead (torch's fake process group: the same sharding, collectives that move no bytes), marked
"1 by 1" in the table; a rank's memory does not depend on the other ranks running beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 2.0**30
LORA_RANK = 32
IMG_TOKENS, TXT_TOKENS = 64, 16


def flux_config(double: int, single: int) -> dict:
    """FLUX.1-dev's transformer config (its hub config.json) with fewer blocks."""
    return dict(patch_size=1, in_channels=64, num_layers=double, num_single_layers=single, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56))


def write_checkpoint(folder: Path, double: int, single: int, config: dict | None = None) -> tuple[int, int]:
    """Random bf16 weights (std 0.02) in a diffusers transformer folder, one shard per block
    (config: the transformer's, default flux_config(double, single)). Returns (parameters, blocks)."""
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import save_file

    from digenrl.learner.sharded import transformer_blocks
    from digenrl.models.empty import params_on_meta

    with params_on_meta():
        module = FluxTransformer2DModel(**(config or flux_config(double, single)))
    folder.mkdir(parents=True, exist_ok=True)
    module.save_config(folder)
    blocks = transformer_blocks(module)
    prefixes = {id(b): p + "." for p, b in module.named_modules() if any(b is x for x in blocks)}
    groups: dict[str, list[str]] = {}
    for name, _ in module.named_parameters():
        prefix = next((p for p in prefixes.values() if name.startswith(p)), "root.")
        groups.setdefault(prefix, []).append(name)
    params = dict(module.named_parameters())
    gen = torch.Generator().manual_seed(0)
    weight_map, n = {}, 0
    for i, (prefix, names) in enumerate(groups.items()):
        fname = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {k: (torch.randn(params[k].shape, generator=gen) * 0.02).to(torch.bfloat16) for k in names}
        save_file(tensors, str(folder / fname))
        n += sum(t.numel() for t in tensors.values())
        weight_map.update({k: fname for k in names})
        del tensors
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * n}, "weight_map": weight_map}))
    return n, len(blocks)


def build_module(folder: Path, loader: str, lora: bool, device: str = "cpu"):
    """(module, weight files) of the checkpoint in `folder` as a gang rank builds it: `whole`
    loads every fp32 weight (on `device`), `sharded` builds on the meta device for load_sharded
    to fill; LoRA adapters injected where their base layer is (shared with gpu_load_check)."""
    from diffusers import FluxTransformer2DModel

    from digenrl.models.diffusers_adapters.base import DEFAULT_LORA_TARGETS, _dtype_kwarg
    from digenrl.models.empty import WeightFiles, params_on_meta
    from digenrl.models.lora import LoraSpec, apply_lora

    if loader == "whole":
        module = FluxTransformer2DModel.from_pretrained(folder, **{_dtype_kwarg(): torch.float32}).to(device)
        files = None
    else:
        with params_on_meta():
            module = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(folder))
        files = WeightFiles.in_folder(folder)
    module.requires_grad_(not lora)
    if lora:  # (peft puts the adapters where their base layer is)
        apply_lora(module, LoraSpec(LORA_RANK, 2.0 * LORA_RANK, DEFAULT_LORA_TARGETS))
    return module, files


def _rss_gib() -> float:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(m.group(1)) * 1024 / GIB


def _rank(rank: int, world: int, args: dict) -> None:
    """One rank: load (before or after), then the LoRA step; writes its figures to a JSON file."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    if args["fake"]:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", init_method=f"file://{args['out']}/store", rank=rank, world_size=world)
    try:
        out = _measure(init_device_mesh("cpu", (world,)), args)
        Path(args["out"], f"rank{rank}.json").write_text(json.dumps(out))
        if not args["fake"]:
            dist.barrier()
    finally:
        dist.destroy_process_group()
    if not args["fake"]:
        os._exit(0)  # (gloo's threads at interpreter teardown: see tests/learner/test_sharded.py)


def _measure(mesh, args: dict) -> dict:
    from digenrl.profile.timing import PeakMemory
    from digenrl.runtime.gang_rank import load_sharded

    folder, lora = Path(args["folder"]), args["lora"]
    peak = PeakMemory(torch.device("cpu"))
    out = {}
    peak.reset()
    base = _rss_gib()
    t0 = time.time()
    module, files = build_module(folder, args["loader"], lora)
    policy = SimpleNamespace(module=module, weight_files=files)
    load_sharded(policy, mesh, dtype="bfloat16", lora=lora)
    out.update(base_gib=base, load_gib=peak.read() - base, load_s=time.time() - t0)
    if lora and args["step"]:
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-5)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(1, IMG_TOKENS, 64, generator=gen)
        text = torch.randn(1, TXT_TOKENS, 4096, generator=gen)
        pooled = torch.randn(1, 768, generator=gen)
        img_ids, txt_ids = torch.zeros(IMG_TOKENS, 3), torch.zeros(TXT_TOKENS, 3)
        peak.reset()
        before = _rss_gib()
        t0 = time.time()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            v = module(hidden_states=x, encoder_hidden_states=text, pooled_projections=pooled,
                       timestep=torch.tensor([0.5]), img_ids=img_ids, txt_ids=txt_ids, guidance=torch.tensor([3.5]),
                       return_dict=False)[0]
            v.float().pow(2).mean().backward()
            optimizer.step()
        out.update(step_gib=peak.read() - base, step_from_gib=before - base, step_s=time.time() - t0,
                   alloc_gib=allocator_peak(prof) / GIB)
    return out


def allocator_peak(prof) -> int:
    """Bytes live at the allocator's peak above where the profiled region started: torch.profiler's
    CPU memory events (each allocation and free, in order), summed. Unlike the RSS high-water mark
    it counts no freed pages the process keeps."""
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = top = 0
    for _, nbytes in events:
        live += nbytes
        top = max(top, live)
    return top


def _run(world: int, args: dict) -> list[dict]:
    import torch.multiprocessing as mp

    out = Path(args["out"])
    for f in out.glob("rank*.json"):
        f.unlink()
    (out / "store").unlink(missing_ok=True)
    if args["fake"]:  # one rank at a time, each in its own process (a fresh high-water mark)
        for rank in range(world):
            mp.spawn(_one_fake, args=(rank, world, args), nprocs=1, join=True)
    else:
        mp.spawn(_rank, args=(world, args), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _one_fake(_, rank: int, world: int, args: dict) -> None:
    _rank(rank, world, args)


def _available_gib() -> float:
    m = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return int(m.group(1)) * 1024 / GIB


def main() -> None:
    from digenrl.sim.memory import GANG_GATHERED_BLOCKS, gang_gathered_gib, gang_rank_memory, load_gib

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--double", type=int, default=2, help="double-stream blocks (FLUX.1-dev: 19)")
    ap.add_argument("--single", type=int, default=2, help="single-stream blocks (FLUX.1-dev: 38)")
    ap.add_argument("--gangs", default="1,2,4")
    ap.add_argument("--no-step", action="store_true", help="loads only")
    ap.add_argument("--train", default="full,lora", help="full, lora or both")
    ap.add_argument("--loaders", default="whole,sharded", help="whole, sharded or both")
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp folder)")
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="load_memory_"))
    folder = root / "transformer"
    try:
        t0 = time.time()
        n, blocks = write_checkpoint(folder, a.double, a.single)
        adapters = _lora_params(folder)
        print(f"FLUX.1-dev transformer, width 3072, {a.double}+{a.single} blocks: {n / 1e9:.3f}B parameters "
              f"(LoRA rank {LORA_RANK}: {adapters / 1e6:.1f}M), random bf16 checkpoint written in {time.time() - t0:.0f} s")
        print("GiB per rank, the largest over the gang's ranks, above the rank's RSS before loading (base)\n")
        sizes = _block_params(folder)
        print(f"blocks: {', '.join(f'{b / 1e6:.0f}M' for b in sizes)}; sim's gathered bf16 blocks at a gang > 1: "
              f"{GANG_GATHERED_BLOCKS} x the mean block, {gang_gathered_gib(n, blocks, 2):.2f} GiB "
              f"(x the largest: {gang_gathered_gib(max(sizes), 1, 2):.2f})")
        print(f"{'gang':>4} {'train':>5} {'loader':>7} | {'load':>6} {'sim':>6} | {'step':>6} {'sim':>6} | "
              f"{'alloc':>6} {'gath':>6} | {'base':>5} {'load s':>6}  run")
        for gang in [int(g) for g in a.gangs.split(",")]:
            for lora in [t == "lora" for t in a.train.split(",")]:
                for loader in a.loaders.split(","):
                    held, transient = load_gib(n, blocks, gang, adapters=adapters if lora else 0.0, loader=loader)
                    sim_load = held + transient
                    fake = gang * (sim_load + 0.6) > 0.7 * _available_gib()
                    args = dict(folder=str(folder), lora=lora, loader=loader, step=lora and not a.no_step,
                                out=str(root), fake=fake)
                    ranks = _run(gang, args)
                    row = {k: max(r[k] for r in ranks) for k in ranks[0]}
                    sim_step = gang_rank_memory(n, blocks, gang, adapters=adapters if lora else 0.0).resident
                    gathered = gang_gathered_gib(n, blocks, gang)
                    step = (f"{row['step_gib']:6.2f} {sim_step:6.2f} | {row['alloc_gib']:6.2f} {gathered:6.2f}"
                            if "step_gib" in row else f"{'-':>6} {'-':>6} | {'-':>6} {'-':>6}")
                    print(f"{gang:>4} {'lora' if lora else 'full':>5} {loader:>7} | {row['load_gib']:6.2f} "
                          f"{sim_load:6.2f} | {step} | {row['base_gib']:5.2f} {row['load_s']:6.1f}  "
                          f"{'1 by 1' if fake else 'gloo'}", flush=True)
    finally:
        if a.dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _block_params(folder: Path) -> list[int]:
    """Parameters of each FSDP unit (transformer block) of the checkpoint's transformer."""
    from diffusers import FluxTransformer2DModel

    from digenrl.learner.sharded import transformer_blocks
    from digenrl.models.empty import params_on_meta

    with params_on_meta():
        module = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(folder))
    return [sum(p.numel() for p in b.parameters()) for b in transformer_blocks(module)]


def _lora_params(folder: Path) -> int:
    """LoRA parameters of rank LORA_RANK on the attention projections of this transformer."""
    from diffusers import FluxTransformer2DModel

    from digenrl.models.diffusers_adapters.base import DEFAULT_LORA_TARGETS
    from digenrl.models.empty import params_on_meta
    from digenrl.models.lora import LoraSpec, apply_lora

    with params_on_meta():
        module = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(folder))
    apply_lora(module, LoraSpec(LORA_RANK, 2.0 * LORA_RANK, DEFAULT_LORA_TARGETS))
    return sum(p.numel() for name, p in module.named_parameters() if "lora_" in name)


if __name__ == "__main__":
    main()

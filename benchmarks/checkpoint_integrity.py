"""What does checkpoint integrity cost, on save and on resume, against the plain write and read?

    python benchmarks/checkpoint_integrity.py [--gib 2] [--ranks 1 2] [--cache cold] [--dir DIR]
    python benchmarks/checkpoint_integrity.py --hash-speed      # the hashes alone, in memory

The state is a stack of 4096x4096 fp32 linear layers after one AdamW step: weights plus
exp_avg and exp_avg_sq, 12 bytes a parameter, `--gib` GiB on disk in all (the layout of a
full fine-tune, at a size this machine holds). With `--ranks 2` two gloo processes shard it
with FSDP2 and each writes its half (the sharded `dcp/` layout, as a trainer gang does);
`--ranks 1` is one process, no process group (how the local Trainer writes `dcp/`).

Rows, timed at rank 0 between barriers, best of `--repeats`:
  plain      DCP's HuggingFaceStorageWriter + optimizer.json: the write with no integrity;
             read = load_sharded (every rank reads its slices)
  sha256     what digenrl did before: the plain write, then one thread re-reads every file
             with sha256 for the manifest; resume = the same sequential sha256 read, then load
  xxh3_128   save_sharded_checkpoint as it is now: each rank hashes its shards while writing,
             rank 0 merges, commits (temp folder, manifest, state.json, rename); resume =
             verify_checkpoint (one thread per file) in one process, as the driver does, then
             every rank loads
overhead % = (with integrity - plain) / plain. DCP fsyncs every shard, so write times include
the flush to disk. Reads: `--cache cold` (default) drops this checkpoint's pages from the page
cache (posix_fadvise DONTNEED per file) before each timed read, so the first read of a file
comes from the disk (or from the hypervisor's cache on a VM; this script cannot see that);
`--cache warm` reads right after writing. On resume the verify pass leaves the files cached,
so the load after it reads memory when the checkpoint fits in RAM: the read+verify column
includes that effect, as a real resume does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from digenrl.io import checkpoint as ckpt

DIM = 4096  # one layer: DIM^2 fp32 parameters, 12 * DIM^2 bytes with AdamW's two moments


# -- the hashes alone -----------------------------------------------------------------
def hash_speed(mib: int = 256, threads: int = os.cpu_count() or 1) -> list[tuple[str, float, float]]:
    """(hash, MiB/s one thread, MiB/s `threads` threads each hashing its own copy) in memory."""
    import xxhash

    hashes = {"sha256": hashlib.sha256, "xxh3_128": xxhash.xxh3_128}
    try:
        import blake3

        hashes["blake3"] = blake3.blake3
    except ImportError:
        pass
    data = memoryview(os.urandom(1 << 20) * mib)
    chunk = 1 << 24

    def run(new) -> None:
        h = new()
        for i in range(0, len(data), chunk):
            h.update(data[i:i + chunk])

    rows = []
    for name, new in hashes.items():
        one = min(_timed(run, new) for _ in range(3))
        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(run, [new] * threads))
            many = time.perf_counter() - t0
        rows.append((name, mib / one, mib * threads / many))
    return rows


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


# -- the checkpoint rows --------------------------------------------------------------
def _state(layers: int, group, dim: int = DIM) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`layers` dim x dim linear layers after one AdamW step (FSDP2-sharded over `group`'s ranks)."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(*[torch.nn.Linear(dim, dim, bias=False) for _ in range(layers)])
    if group is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("shard",))
        for layer in module:
            fully_shard(layer, mesh=mesh)
        fully_shard(module, mesh=mesh)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    for p in module.parameters():
        p.grad = None
    return module, optimizer


def _plain_write(step_dir: Path, module, optimizer, group) -> None:
    """The sharded save with no integrity: DCP's own writer, then optimizer.json."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint import save as dcp_save

    out = step_dir / ckpt.DCP_DIR
    out.mkdir(parents=True, exist_ok=True)
    tensors, groups = ckpt._dcp_state(module, optimizer, None)
    with ckpt._quiet_if_alone(group):
        dcp_save(tensors, storage_writer=HuggingFaceStorageWriter(str(out), save_distributed=True),
                 process_group=group, no_dist=group is None)
    if _lead(group):
        (out / "optimizer.json").write_text(json.dumps(groups))


def _sha256_files(step_dir: Path) -> dict[str, str]:
    """The manifest digenrl wrote before: one thread, every file read back with sha256."""
    out = {}
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name not in (ckpt.MANIFEST, "state.json")):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        out[str(path.relative_to(step_dir))] = h.hexdigest()
    return out


def _drop_cache(step_dir: Path) -> None:
    for path in step_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # DONTNEED drops clean pages only
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _fs_type(path: Path) -> str:
    """The file system `path` lies on (/proc/mounts' longest matching mount point)."""
    path, best = str(Path(path).resolve()), ("", "unknown")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, kind = line.split()[:3]
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best[0]):
            best = (point, kind)
    return best[1]


def _lead(group) -> bool:
    return group is None or dist.get_rank() == 0


def _sync(group) -> None:
    if group is not None:
        dist.barrier(group=group)


def _rows(root: Path, layers: int, group, repeats: int, cold: bool, dim: int = DIM) -> dict[str, dict[str, float]]:
    """Seconds of each (row, phase) at rank 0: best of `repeats`, the rows' order rotated
    each repeat (a warm-up round on a small state first: imports and first calls untimed)."""
    if dim == DIM:
        _rows(root / "warmup", 1, group, 1, cold, dim=256)
    module, optimizer = _state(layers, group, dim)
    dirs = {"plain": root / "plain", "sha256": root / "sha256", "xxh3_128": root / "run"}
    step_dir = dirs["xxh3_128"] / "checkpoints" / "step_000001"
    lead = _lead(group)
    write = {
        "plain": lambda: _plain_write(dirs["plain"], module, optimizer, group),
        "sha256": lambda: (_plain_write(dirs["sha256"], module, optimizer, group), _sync(group),
                           lead and _sha256_files(dirs["sha256"])),
        "xxh3_128": lambda: ckpt.save_sharded_checkpoint(dirs["xxh3_128"], 1, module=module, optimizer=optimizer,
                                                         ema=None, state={"step": 1}, keep=1, group=group),
    }
    read = {  # in a resumed run the driver verifies (one process), then every rank loads
        "plain": lambda: ckpt.load_sharded(dirs["plain"], module, optimizer, None, group),
        "sha256": lambda: (lead and _sha256_files(dirs["sha256"]), _sync(group),
                           ckpt.load_sharded(dirs["sha256"], module, optimizer, None, group)),
        "xxh3_128": lambda: (lead and ckpt.verify_checkpoint(step_dir), _sync(group),
                             ckpt.load_sharded(step_dir, module, optimizer, None, group)),
    }
    best: dict[str, dict[str, float]] = {row: {} for row in write}

    def timed(row: str, phase: str, fn) -> None:
        _sync(group)
        t0 = time.perf_counter()
        fn()
        _sync(group)
        dt = time.perf_counter() - t0
        best[row][phase] = min(dt, best[row].get(phase, float("inf")))

    names, gib = list(write), 0.0
    for i in range(repeats):
        for row in names[i % 3:] + names[:i % 3]:  # one checkpoint on disk at a time
            timed(row, "write", write[row])
            if row == "xxh3_128":
                gib = sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file()) / 2**30
            if cold and lead:
                _drop_cache(step_dir if row == "xxh3_128" else dirs[row])
            timed(row, "read", read[row])
            if lead:
                shutil.rmtree(dirs[row])
    best["_size_gib"] = {"gib": gib}
    return best


def _rank(rank: int, world: int, root: str, layers: int, repeats: int, cold: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=world)
    try:
        rows = _rows(Path(root), layers, dist.group.WORLD, repeats, cold)
        if rank == 0:
            (Path(root) / "rows.json").write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(ranks: int, gib: float, repeats: int, cold: bool, parent: Path) -> dict[str, dict[str, float]]:
    layers = max(1, round(gib * 2**30 / (12 * DIM * DIM)))
    root = Path(tempfile.mkdtemp(prefix="ckpt_bench_", dir=parent))
    try:
        if ranks == 1:
            return _rows(root, layers, None, repeats, cold)
        mp.spawn(_rank, args=(ranks, str(root), layers, repeats, cold), nprocs=ranks, join=True)
        return json.loads((root / "rows.json").read_text())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=2.0, help="checkpoint size on disk, GiB (weights + AdamW)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cache", choices=["cold", "warm"], default="cold")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: the system temp dir)")
    ap.add_argument("--hash-speed", action="store_true", help="only the in-memory hash speeds")
    args = ap.parse_args()

    threads = os.cpu_count() or 1
    print(f"hash speed in memory, 256 MiB, MiB/s ({threads} threads: each its own stream)")
    print(f"{'hash':<10} {'1 thread':>10} {f'{threads} threads':>11}")
    for name, one, many in hash_speed(threads=threads):
        print(f"{name:<10} {one:>10.0f} {many:>11.0f}")
    if args.hash_speed:
        return
    where = args.dir or Path(tempfile.gettempdir())
    print(f"\ncheckpoint integrity overhead (best of {args.repeats}; reads {args.cache}; {threads} cores; "
          f"{where} on {_fs_type(where)}; load average {os.getloadavg()[0]:.1f} at start)")
    print(f"{'size GiB':>8} {'hash':<9} {'ranks':>5} {'write s':>8} {'+integrity s':>12} {'overhead':>8} "
          f"{'read s':>7} {'+verify s':>9} {'overhead':>8}")
    for ranks in args.ranks:
        rows = measure(ranks, args.gib, args.repeats, args.cache == "cold", where)
        gib, plain = rows["_size_gib"]["gib"], rows["plain"]
        for name in ("sha256", "xxh3_128"):
            row = rows[name]
            w = 100 * (row["write"] - plain["write"]) / plain["write"]
            r = 100 * (row["read"] - plain["read"]) / plain["read"]
            print(f"{gib:>8.2f} {name:<9} {ranks:>5} {plain['write']:>8.2f} {row['write']:>12.2f} {w:>7.0f}% "
                  f"{plain['read']:>7.2f} {row['read']:>9.2f} {r:>7.0f}%", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

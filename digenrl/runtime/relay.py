"""The collective weight path: a relay in trainer-0's rank 0 serves published weights to rollout
workers point-to-point, over one 2-rank process group per rollout worker.

    trainer-0 rank 0 (main thread)              rollout worker i
      OptimizerStep(k): relay.put(k+1, state)
    trainer-0 rank 0 (relay thread)
      addr = relay.open(i)       ---addr--->    client.connect(addr)     (the pair group forms)
      relay.accept(i)            <--------->
      ...                                       WeightSync(k+1), at its trajectory boundary:
      relay.serve(i, k+1)  -- header, buckets -> client.receive(module) -> (k+1, bytes)

The pull model of `digenrl.sched` is kept: a rollout worker asks for a version when it is at a
trajectory boundary; the relay answers from a copy it keeps (the latest `keep` versions), so
the trainer's own thread never waits for a rollout worker (the relay's calls run on another
thread, e.g. a Ray concurrency group; every blocking call below releases the GIL).

Wire format of one serve (all on the pair group, rank 0 -> rank 1, in this order):
    int64   (1,)            header length L in bytes
    uint8   (L,)            header: json {"version", "buckets": [[dtype, numel]],
                                          "tensors": [[name, bucket, offset, shape]]}
    <dtype> (numel,) x B    the buckets: each tensor flattened at `offset` (elements) of its bucket

Process groups: each pair is a standalone backend object, `ProcessGroupGloo(store, rank, 2)`
(CPU) or `ProcessGroupNCCL(store, rank, 2, options)` (CUDA), over a `PrefixStore` of one
`TCPStore` that the relay hosts on a free port. Such a backend is not registered with
`torch.distributed` (the trainer's default group, used by FSDP, is untouched) and is driven
through its own `send`/`recv` methods. A replaced rollout worker gets a fresh prefix, hence a
fresh pair group.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from digenrl.learner.comm import CommCounter

SERVER, CLIENT = 0, 1  # ranks in a pair group
TAG = 0  # one tag: messages between one pair arrive in the order they were sent


class RelayAddress(NamedTuple):
    """Where a rollout worker joins its pair group (picklable; the relay hands it out)."""

    host: str
    port: int
    prefix: str  # this pair's namespace in the relay's TCPStore
    backend: str  # "gloo" | "nccl"


# --- packing: a state dict <-> flat buckets per dtype, and the header that describes them ---


@dataclass
class Packed:
    """One published version: its header (json-able) and the buckets it describes."""

    header: dict
    buckets: list[torch.Tensor]  # 1-D, one dtype each
    ready: Optional[object] = None  # a CUDA event recorded after the copies (None on CPU)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buckets)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"relay header names an unknown dtype {name!r}")
    return dtype


def pack(version: int, state: dict[str, torch.Tensor], bucket_bytes: int,
         device: torch.device | str = "cpu", dtype: Optional[torch.dtype] = None, pin: bool = False) -> Packed:
    """Copy `state` into flat buckets, one dtype per bucket, each at most `bucket_bytes` (a tensor
    larger than that gets a bucket of its own). `dtype` casts floating-point tensors (the
    rollout's model dtype); other tensors keep theirs. Buckets live on `device` (pinned host
    memory with `pin`, for fast staging to a GPU)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    cast = {k: (dtype if dtype is not None and v.is_floating_point() else v.dtype) for k, v in state.items()}
    buckets: list[list] = []  # [dtype name, numel]
    open_bucket: dict[torch.dtype, int] = {}  # dtype -> index of the bucket it is filling
    tensors = []  # [name, bucket, offset (elements), shape]
    for name, t in state.items():
        dt, n = cast[name], t.numel()
        itemsize = torch.empty((), dtype=dt).element_size()
        b = open_bucket.get(dt)
        if b is None or (buckets[b][1] > 0 and (buckets[b][1] + n) * itemsize > bucket_bytes):
            b = open_bucket[dt] = len(buckets)
            buckets.append([_dtype_name(dt), 0])
        tensors.append([name, b, buckets[b][1], list(t.shape)])
        buckets[b][1] += n
    flat = [torch.empty(n, dtype=_dtype(d), device=device, pin_memory=pin) for d, n in buckets]
    with torch.no_grad():
        for (name, b, offset, shape) in tensors:
            t = state[name]
            flat[b][offset: offset + t.numel()].view(t.shape).copy_(t.detach())
    ready = None
    if flat and flat[0].is_cuda:  # the sends run on another thread's streams: they wait for this
        ready = torch.cuda.Event()
        ready.record()
    return Packed({"version": int(version), "buckets": buckets, "tensors": tensors}, flat, ready)


def unpack(header: dict, buckets: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Name -> view into the buckets (no copy), as `pack` laid them out."""
    out = {}
    for name, b, offset, shape in header["tensors"]:
        n = 1
        for d in shape:
            n *= d
        out[name] = buckets[b][offset: offset + n].view(shape)
    return out


# --- the pair group ---


def _pair_group(store: dist.Store, rank: int, backend: str, device: torch.device, timeout: timedelta):
    """A standalone 2-rank backend (blocks until both ranks have joined)."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, 2, timeout)
    from torch.distributed import ProcessGroupNCCL  # absent from CPU builds of torch

    opts = ProcessGroupNCCL.Options()
    opts._timeout = timeout
    pg = ProcessGroupNCCL(store, rank, 2, opts)
    pg.eager_connect_single_device(device)  # both ranks build the communicator now, not on first send
    return pg


def _backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


class Relay:
    """Trainer-0's rank 0: keeps the latest published versions and serves them to rollout workers.

    `put` is called by the trainer's own thread; `open`, `accept`, `serve` and `close` by the
    relay thread (they block on the network). Byte counts go to `counter` (kind "send",
    phase "sync"): the payload (buckets) only, the few-kB header is not counted.
    """

    def __init__(self, *, device: torch.device | str = "cpu", bucket_bytes: int = 256 << 20, keep: int = 2,
                 host: str = "127.0.0.1", counter: Optional[CommCounter] = None, timeout_s: float = 300.0):
        # host: the address rollout workers reach this process at (the node IP when they run on
        # other nodes; the runtime passes it). The TCPStore listens on every interface.
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.device = torch.device(device)
        self.backend = _backend_for(self.device)
        self.bucket_bytes, self.keep, self.host = int(bucket_bytes), int(keep), host
        self.counter = counter
        self.timeout = timedelta(seconds=timeout_s)
        self._versions: OrderedDict[int, Packed] = OrderedDict()
        self._lock = threading.Lock()  # put (trainer thread) vs serve (relay thread)
        self._store: Optional[dist.TCPStore] = None
        self._pending: dict[str, dist.PrefixStore] = {}
        self._groups: dict[str, object] = {}
        self._generation = itertools.count()

    # trainer thread

    def put(self, version: int, state: dict[str, torch.Tensor], dtype: Optional[torch.dtype] = None) -> int:
        """Keep a copy of `state` as `version` (evicting beyond the latest `keep`); returns its bytes."""
        # Versions are held on the host (pinned under CUDA), not on the trainer's GPU: two
        # full bf16 copies of a 12B model would be ~48 GB beside the FSDP shards. A send
        # stages one bucket at a time on the device (`serve`).
        packed = pack(version, state, self.bucket_bytes, "cpu", dtype, pin=self.device.type == "cuda")
        with self._lock:
            self._versions.pop(int(version), None)
            self._versions[int(version)] = packed
            while len(self._versions) > self.keep:
                self._versions.popitem(last=False)
        return packed.nbytes

    @property
    def versions(self) -> list[int]:
        """The versions held now, oldest first."""
        with self._lock:
            return list(self._versions)

    def layout(self, version: int) -> dict:
        """The header `serve(peer, version)` sends (names, shapes, buckets)."""
        return self._get(version).header

    # relay thread

    def open(self, peer: str) -> RelayAddress:
        """Start the rendezvous of `peer`'s pair group (closing a previous one: a replaced worker)."""
        self.close(peer)
        if self._store is None:  # port 0: the OS picks a free port
            self._store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                        timeout=self.timeout)
        prefix = f"relay/{peer}/{next(self._generation)}"
        self._pending[peer] = dist.PrefixStore(prefix, self._store)
        return RelayAddress(self.host, self._store.port, prefix, self.backend)

    def accept(self, peer: str) -> None:
        """Complete `peer`'s pair group; blocks until its `RelayClient.connect` joins."""
        if peer not in self._pending:
            raise KeyError(f"accept({peer!r}) before open({peer!r})")
        store = self._pending.pop(peer)
        self._groups[peer] = _pair_group(store, SERVER, self.backend, self.device, self.timeout)

    def serve(self, peer: str, version: int) -> int:
        """Send `version` to `peer` (header, then buckets); returns the payload bytes sent."""
        packed = self._get(version)  # held here: a put that evicts it meanwhile does not free it
        if peer not in self._groups:
            raise KeyError(f"serve to {peer!r}, which has no pair group (open + accept first)")
        pg = self._groups[peer]
        if packed.ready is not None:
            packed.ready.synchronize()
        header = torch.frombuffer(bytearray(json.dumps(packed.header).encode()), dtype=torch.uint8)
        length = torch.tensor([header.numel()], dtype=torch.int64)
        for t in (length, header, *packed.buckets):
            if self.device.type == "cuda":  # NCCL sends device memory: stage this bucket
                t = t.to(self.device, non_blocking=True)
                torch.cuda.current_stream(self.device).synchronize()
            pg.send([t], CLIENT, TAG).wait()
        if self.counter is not None:
            self.counter.add_bytes("send", packed.nbytes, phase="sync")
        return packed.nbytes

    def close(self, peer: str) -> None:
        """Forget `peer`'s pair group (a worker that left or is being replaced)."""
        self._pending.pop(peer, None)
        pg = self._groups.pop(peer, None)
        if pg is not None and hasattr(pg, "shutdown"):
            pg.shutdown()

    def _get(self, version: int) -> Packed:
        with self._lock:
            if int(version) not in self._versions:
                raise KeyError(f"relay holds versions {list(self._versions)}, not {version} "
                               f"(it keeps the latest {self.keep})")
            return self._versions[int(version)]


class RelayClient:
    """A rollout worker's end of its pair group with the relay."""

    def __init__(self, *, device: torch.device | str = "cpu", timeout_s: float = 300.0):
        self.device = torch.device(device)
        self.timeout = timedelta(seconds=timeout_s)
        self._pg = None
        self._store = None  # the TCPStore client: kept alive as long as the group

    def connect(self, address: RelayAddress) -> None:
        """Join the pair group the relay opened for this worker (the relay's `accept` returns)."""
        if address.backend != _backend_for(self.device):
            raise ValueError(f"relay speaks {address.backend}, this client's device is {self.device}")
        self._store = dist.TCPStore(address.host, address.port, is_master=False, wait_for_workers=False,
                                    timeout=self.timeout)
        self._pg = _pair_group(dist.PrefixStore(address.prefix, self._store), CLIENT, address.backend,
                               self.device, self.timeout)

    def receive_state(self) -> tuple[int, dict[str, torch.Tensor], int]:
        """Receive one served version: (version, name -> tensor on this client's device, payload bytes)."""
        if self._pg is None:
            raise RuntimeError("receive before connect")
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._pg.recv([length], SERVER, TAG).wait()
        raw = torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        self._pg.recv([raw], SERVER, TAG).wait()
        header = json.loads(bytes(raw.cpu().numpy()).decode())
        buckets = [torch.empty(n, dtype=_dtype(d), device=self.device) for d, n in header["buckets"]]
        for b in buckets:
            self._pg.recv([b], SERVER, TAG).wait()
        return header["version"], unpack(header, buckets), sum(b.numel() * b.element_size() for b in buckets)

    def receive(self, module: torch.nn.Module) -> tuple[int, int]:
        """Receive one served version into `module`'s tensors in place, by name; returns
        (version, payload bytes). Raises on names the module lacks or shapes that differ (after
        the whole payload is read, so the pair group stays in step)."""
        version, state, nbytes = self.receive_state()
        own = module.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"relay payload names {len(unknown)} tensors the module lacks, e.g. {unknown[:3]}")
        wrong = [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in state.items() if v.shape != own[k].shape]
        if wrong:
            raise ValueError(f"relay payload shapes differ from the module's (name, sent, own): {wrong[:3]}")
        with torch.no_grad():
            for k, v in state.items():
                own[k].copy_(v)
        return version, nbytes

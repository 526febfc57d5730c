"""The collective weight path: trainer 0's rank 0 sends each published version once, down a chain
of the rollout workers, each of which keeps a host copy and forwards it chunk by chunk.

    trainer-0 rank 0                                rollout workers (chain order)
      OptimizerStep(k): relay.put(k+1, state)
        D2H into pinned buckets (relay's stream)
        header -> store "h/<seq>"                   r1, r2, ... see the header (store)
      relay thread: chunk -> r1 -----------------> r1: recv chunk, D2H to host, send chunk -> r2 -> ... -> rN
                                                   ...
                                                   WeightSync(k+1) at r_i's trajectory boundary:
                                                     client.load(module, k+1): bucket by bucket H2D
                                                     into the module's own tensors

The scheduler's pull model (`digenrl.sched`) is kept: the transfer runs on background threads as
soon as a version is published, the rollout's WeightSync unit loads the host copy when its
trajectory ends. Trainer 0's NIC sends a version once (the simulator prices the same chain:
`digenrl.sim.collectives.relay_chain_*`); every receiver but the last forwards it once.

Why a chain of pair links, not one collective over every receiver: `sim.collectives.
broadcast_candidates_s` prices both (`python benchmarks/relay_chain.py`). NCCL runs a collective
broadcast as the same pipelined chain (its ring) in finer steps: for FLUX.1's 23.8 GB, 0.597 s
against our 0.598 s at 64 receivers and 0.612 s against 0.619 s at 512 (1.1%); a binomial tree
(gloo's broadcast) takes 4.2-6.0 s and sends 7-10 copies from trainer 0's NIC. Pair links let a
receiver leave, or a new one attach, without a new communicator for everyone.

Failure: every wait on a link has a deadline (`deadline_s`, default RELAY_DEADLINE_S). A
receiver that leaves mid-transfer costs its upstream one deadline at most (at once when the
peer's process is gone): the upstream drops the link, stops forwarding and keeps receiving. Its
downstream notices the same way, fetches that version directly from the relay (a one-off gloo
link from the relay's host buckets) and forwards it, and from then on heads the rest of the
chain: it fetches each later version directly (one more copy from trainer 0's NIC) and
forwards it. If it had already forwarded part of the broken version, its own downstream link is
out of step and is dropped too, and the next receiver does the same. A late joiner
(`Relay.attach`: a replaced or added rollout worker) fetches every version directly.

NCCL (CUDA): each link is a standalone `ProcessGroupNCCL` (not registered with
torch.distributed; the trainers' default group is untouched) built with
TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (CleanUpOnly: the watchdog aborts a communicator whose op
outlives its timeout and the process survives; other groups keep the setting they were built
with), op timeout = deadline_s, connected eagerly within init_timeout_s. Sends and receives run
on the relay's own `torch.cuda.Stream`, from and into pinned host buckets staged one chunk at a
time; `put`'s device-to-host copy runs on a second stream of the relay's, which the trainer's
stream waits for (the payload over PCIe once, which the simulator charges to OptimizerStep). The
trainer's stream never waits for a send or a receiver.
On CPU the links are `ProcessGroupGloo` and the chunks are views of the host buckets.

Memory: the relay holds the latest `keep` versions in pinned host buckets; a receiver holds up
to `keep` received versions in host buckets and, on the device, its module plus one bucket
while it loads (no second device copy) and two chunk buffers while it forwards.

Wire format of one version on a link (chain: the header comes from the store; direct: first):
    int64   (1,)            header length L in bytes (direct links only)
    uint8   (L,)            header: json {"version", "chunk", "buckets": [[dtype, numel]],
                                          "tensors": [[name, bucket, offset, shape]]} (direct only)
    <dtype> (<= chunk,) ..  each bucket in chunks of at most `chunk` bytes, buckets in order
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from digenrl.learner.comm import CommCounter
from digenrl.sim.collectives import RELAY_BUCKET_BYTES, RELAY_CHUNK_BYTES

UP, DOWN = 0, 1  # ranks in a link: the sender (upstream) is 0
TAG = 0  # one tag: messages between one pair arrive in the order they were sent
RELAY_DEADLINE_S = 60.0  # a link that makes no progress for this long is dropped (see module doc)
RELAY_INIT_TIMEOUT_S = 300.0  # forming a link: both ends must join within this
NCCL_ERROR_HANDLING = "2"  # TORCH_NCCL_ASYNC_ERROR_HANDLING for the relay's links: CleanUpOnly
POLL_S = 0.005  # how often an idle relay / receiver thread looks at the store
HEADERS_KEPT = 64  # the store keeps the latest 64 versions' headers (a receiver further behind skips on)


class LinkLost(RuntimeError):
    """A link missed its deadline or its peer went away; it is closed and never used again."""


class ChainAddress(NamedTuple):
    """Where one receiver joins the chain (picklable; the relay hands it out)."""

    host: str
    port: int
    peer: str
    up: Optional[str]  # its upstream link's store prefix (None: fetch every version directly)
    down: Optional[str]  # its downstream link's prefix (None: the tail)
    backend: str  # "gloo" | "nccl"
    first_seq: int  # the first header it follows ("relay/h/<seq>")
    before: int  # versions <= this were published before it joined: load fetches them directly
    deadline_s: float
    init_timeout_s: float


# --- packing: a state dict <-> flat buckets per dtype, and the header that describes them ---


@dataclass
class Packed:
    """One published version: its header (json-able) and the buckets it describes."""

    header: dict
    buckets: list[torch.Tensor]  # 1-D, one dtype each, on the host
    staged: Optional[object] = None  # a CUDA event: the device-to-host copies are done (None on CPU)

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


def layout_of(state: dict[str, torch.Tensor], bucket_bytes: int, dtype: Optional[torch.dtype] = None) -> dict:
    """The header `pack` writes for `state` (version and chunk left out)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list] = []  # [dtype name, numel]
    open_bucket: dict[torch.dtype, int] = {}  # dtype -> index of the bucket it is filling
    tensors = []  # [name, bucket, offset (elements), shape]
    for name, t in state.items():
        dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
        n, itemsize = t.numel(), torch.empty((), dtype=dt).element_size()
        b = open_bucket.get(dt)
        if b is None or (buckets[b][1] > 0 and (buckets[b][1] + n) * itemsize > bucket_bytes):
            b = open_bucket[dt] = len(buckets)
            buckets.append([_dtype_name(dt), 0])
        tensors.append([name, b, buckets[b][1], list(t.shape)])
        buckets[b][1] += n
    return {"buckets": buckets, "tensors": tensors}


def pack(version: int, state: dict[str, torch.Tensor], bucket_bytes: int, dtype: Optional[torch.dtype] = None,
         pin: bool = False, stream=None, chunk_bytes: int = RELAY_CHUNK_BYTES) -> Packed:
    """Copy `state` into flat host buckets, one dtype per bucket, each at most `bucket_bytes` (a
    tensor larger than that gets a bucket of its own). `dtype` casts floating-point tensors (the
    rollout's model dtype); other tensors keep theirs. `pin`: pinned host memory. `stream` (CUDA
    state): the copies run on it after the caller's stream reaches this point, and the caller's
    stream waits for them (the next optimizer step must not overwrite what is being copied); the
    caller's thread does not wait."""
    header = {"version": int(version), "chunk": int(chunk_bytes), **layout_of(state, bucket_bytes, dtype)}
    flat = [torch.empty(n, dtype=_dtype(d), pin_memory=pin) for d, n in header["buckets"]]
    on_cuda = stream is not None and any(t.is_cuda for t in state.values())
    staged = None
    with torch.no_grad():
        if on_cuda:
            caller = torch.cuda.current_stream()
            stream.wait_stream(caller)
            with torch.cuda.stream(stream):
                for name, b, offset, shape in header["tensors"]:
                    t = state[name].detach()
                    flat[b][offset: offset + t.numel()].view(t.shape).copy_(t, non_blocking=True)
                    if t.is_cuda:
                        t.record_stream(stream)
                staged = torch.cuda.Event()
                staged.record(stream)
            caller.wait_event(staged)  # a device-side wait: the trainer's thread goes on
        else:
            for name, b, offset, shape in header["tensors"]:
                t = state[name]
                flat[b][offset: offset + t.numel()].view(t.shape).copy_(t.detach())
    return Packed(header, flat, staged)


def unpack(header: dict, buckets: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Name -> view into the buckets (no copy), as `pack` laid them out."""
    out = {}
    for name, b, offset, shape in header["tensors"]:
        n = 1
        for d in shape:
            n *= d
        out[name] = buckets[b][offset: offset + n].view(shape)
    return out


def chunks(buckets: list[torch.Tensor], chunk_bytes: int) -> list[torch.Tensor]:
    """Every message of a version: each bucket in order, in views of at most chunk_bytes."""
    out = []
    for b in buckets:
        step = max(1, int(chunk_bytes) // b.element_size())
        out.extend(b[i: i + step] for i in range(0, b.numel(), step))
    return out


def payload_bytes(header: dict) -> int:
    return sum(_dtype(d).itemsize * n for d, n in header["buckets"])


# --- links ---


def _backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _process_group(store: dist.Store, rank: int, backend: str, device: torch.device, init_timeout: float,
                   deadline: float):
    """A standalone 2-rank backend (blocks until both ranks have joined)."""
    if backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=init_timeout))
        pg._set_default_timeout(timedelta(seconds=deadline))  # ops: the link's deadline
        return pg
    from torch.distributed import ProcessGroupNCCL  # absent from CPU builds of torch

    opts = ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=deadline)  # the watchdog aborts an op pending longer than this
    before = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = NCCL_ERROR_HANDLING  # read by this constructor
    try:
        pg = ProcessGroupNCCL(store, rank, 2, opts)
    finally:
        if before is None:
            os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
        else:
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = before
    pg.eager_connect_single_device(device)  # both ranks build the communicator now, not on first send
    return pg


class _Link:
    """One end of a 2-rank link. Every wait has the deadline; a missed one closes the link."""

    def __init__(self, pg, rank: int, deadline_s: float, stream=None):
        self.pg, self.other, self.deadline = pg, 1 - rank, float(deadline_s)
        self.stream = stream  # CUDA: ops are issued and waited on this stream
        self.dead = False

    def send(self, t: torch.Tensor):
        return self._op("send", t)

    def recv(self, t: torch.Tensor):
        return self._op("recv", t)

    def _op(self, name: str, t):
        if self.dead:
            raise LinkLost("the link was closed")
        try:
            return getattr(self.pg, name)([t], self.other, TAG)
        except Exception as e:  # the peer left: a closed pair refuses new ops
            self.close()
            raise LinkLost(str(e)) from e

    def wait(self, work) -> None:
        try:
            if self.stream is None:
                work.wait(timedelta(seconds=self.deadline))
                return
            with torch.cuda.stream(self.stream):  # never the caller's (the trainer's) stream
                work.wait()  # NCCL: the relay's stream waits for the op; the host polls below
                done = torch.cuda.Event()
                done.record(self.stream)
            end = time.monotonic() + self.deadline
            while not done.query():
                if time.monotonic() > end:
                    raise TimeoutError(f"no progress within {self.deadline} s")
                time.sleep(POLL_S / 5)
        except Exception as e:
            self.close()
            raise LinkLost(str(e)) from e

    def close(self) -> None:
        if self.dead:
            return
        self.dead = True
        try:
            if self.stream is not None and hasattr(self.pg, "abort"):
                self.pg.abort()
            elif hasattr(self.pg, "shutdown"):
                self.pg.shutdown()
        except Exception:  # closing a broken link: nothing left to save
            pass
        self.pg = None  # gloo closes its sockets when the group is freed: the peer sees it at once


class _Staging:
    """CUDA: two device chunk buffers per dtype, used in turn. Every op on them is issued on one
    stream and at most one send is left outstanding before a buffer is reused, so stream order
    alone keeps a buffer from being overwritten while a send still reads it."""

    def __init__(self, device: torch.device, stream):
        self.device, self.stream = device, stream
        self.bufs: dict = {}
        self.turn = itertools.count()

    def get(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.dtype, next(self.turn) % 2)
        buf = self.bufs.get(key)
        if buf is None or buf.numel() < like.numel():
            buf = self.bufs[key] = torch.empty(like.numel(), dtype=like.dtype, device=self.device)
        return buf[: like.numel()]


def _on(stream):
    """`torch.cuda.stream(stream)`, or nothing on CPU."""
    return torch.cuda.stream(stream) if stream is not None else _NoStream()


class _NoStream:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _send_version(link: _Link, header: dict, buckets: list[torch.Tensor], staging: Optional[_Staging],
                  with_header: bool) -> None:
    """Send one version on `link` (from host buckets; through `staging` on CUDA)."""
    if with_header:
        raw = torch.frombuffer(bytearray(json.dumps(header).encode()), dtype=torch.uint8)
        link.wait(link.send(torch.tensor([raw.numel()], dtype=torch.int64)))
        link.wait(link.send(raw))
    inflight: deque = deque()
    for c in chunks(buckets, header["chunk"]):
        if staging is not None:
            with torch.cuda.stream(staging.stream):
                dev = staging.get(c)
                dev.copy_(c, non_blocking=True)
                inflight.append(link.send(dev))
        else:
            inflight.append(link.send(c))
        while len(inflight) > 1:  # two chunks in flight: one's latency overlaps the next's bytes
            link.wait(inflight.popleft())
    while inflight:
        link.wait(inflight.popleft())


class Relay:
    """Trainer-0's rank 0: keeps the latest published versions and sends each down the chain once.

    `put` is called by the trainer's own thread and returns at once (CUDA: after queueing the
    device-to-host copies). `open_chain`, `accept_chain` and `attach` block on the network: the
    runtime calls them on the actor's "relay" thread. The relay's own thread sends versions and
    serves direct fetches. Byte counts go to `counter` (kind "send", phase "sync"): payload only.
    """

    def __init__(self, *, device: torch.device | str = "cpu", bucket_bytes: int = RELAY_BUCKET_BYTES,
                 chunk_bytes: int = RELAY_CHUNK_BYTES, keep: int = 2, host: str = "127.0.0.1",
                 counter: Optional[CommCounter] = None, deadline_s: float = RELAY_DEADLINE_S,
                 init_timeout_s: float = RELAY_INIT_TIMEOUT_S):
        # host: the address receivers reach this process at (the node IP when they run on other
        # nodes; the runtime passes it). The TCPStore listens on every interface.
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.device = torch.device(device)
        self.backend = _backend_for(self.device)
        self.bucket_bytes, self.chunk_bytes, self.keep, self.host = int(bucket_bytes), int(chunk_bytes), int(keep), host
        self.counter = counter or CommCounter()
        self.deadline_s, self.init_timeout_s = float(deadline_s), float(init_timeout_s)
        cuda = self.device.type == "cuda"
        # two streams of the relay's own: put's device-to-host copies (which the trainer's stream
        # waits for) must not queue behind the sends (which it must never wait for)
        self.copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self.stream = torch.cuda.Stream(self.device) if cuda else None  # the sends
        self.errors: list[str] = []  # what the relay's thread gave up on (a receiver lost, ...)
        self._versions: OrderedDict[int, Packed] = OrderedDict()
        self._lock = threading.Lock()  # put (trainer thread) vs the relay's threads
        self._done = threading.Condition(self._lock)  # a send or a direct fetch finished (drain)
        self._sending = False  # the relay's thread is pushing a version or serving a fetch
        self._store: Optional[dist.TCPStore] = None
        self._gen = itertools.count()
        self._seq = 0  # the next header's number
        self._head: Optional[_Link] = None
        self._queue: deque = deque()  # (seq, Packed) to send down the chain, in order
        self._announcing = False  # a chain or a direct receiver exists: every put gets a header
        self._pending_head: Optional[tuple[str, int]] = None  # open_chain's first link and seq
        self._served = 0  # direct fetches served (tickets are 1, 2, ...)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # trainer thread

    def put(self, version: int, state: dict[str, torch.Tensor], dtype: Optional[torch.dtype] = None) -> int:
        """Keep `state` as `version` (evicting beyond the latest `keep`) and send it down the chain;
        returns its bytes."""
        return self.commit(pack(version, state, self.bucket_bytes, dtype, pin=self.device.type == "cuda",
                                stream=self.copy_stream, chunk_bytes=self.chunk_bytes))

    def reserve(self, version: int, like: dict[str, torch.Tensor], dtype: Optional[torch.dtype] = None) -> Packed:
        """Empty host buckets laid out for tensors shaped like `like` (DTensors too: only shapes and
        dtypes are read); the caller fills `unpack(p.header, p.buckets)` (a gang's rank 0 copies
        each gathered tensor straight in), then `commit`s it."""
        header = {"version": int(version), "chunk": self.chunk_bytes, **layout_of(like, self.bucket_bytes, dtype)}
        pin = self.device.type == "cuda"
        return Packed(header, [torch.empty(n, dtype=_dtype(d), pin_memory=pin) for d, n in header["buckets"]])

    def commit(self, packed: Packed) -> int:
        """Keep a filled `Packed` as its version and send it down the chain; returns its bytes."""
        version = int(packed.header["version"])
        with self._lock:
            self._versions.pop(version, None)
            self._versions[version] = packed
            while len(self._versions) > self.keep:
                self._versions.popitem(last=False)
            if self._announcing:
                self._announce(version)
        return packed.nbytes

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued version has been sent down the chain and every direct fetch
        asked for has been served, each counted in `counter`; False if `timeout_s` passed first.
        A receiver can hold a version before the relay's thread sees its send complete, so a
        reader of the relay's byte counts drains first."""
        end = time.monotonic() + timeout_s
        while True:
            requested = self._requested()  # a store round trip: not under the lock put takes
            with self._done:
                if not (self._queue or self._sending or self._served < requested):
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(min(left, POLL_S * 20))

    @property
    def versions(self) -> list[int]:
        """The versions held now, oldest first."""
        with self._lock:
            return list(self._versions)

    def layout(self, version: int) -> dict:
        """The header of `version` (names, shapes, buckets)."""
        return self._get(version).header

    # the actor's relay thread

    def open_chain(self, peers: list[str]) -> dict[str, ChainAddress]:
        """Lay out a new chain relay -> peers[0] -> ... -> peers[-1]: each receiver's address.
        Every receiver then calls `RelayClient.connect` while the relay calls `accept_chain`."""
        if not peers:
            raise ValueError("a chain needs at least one receiver")
        self._ensure_store()
        gen = next(self._gen)
        links = [f"relay/{gen}/link/{i}" for i in range(len(peers))]  # link i ends at peers[i]
        with self._lock:
            first, before = self._seq, -1  # the latest version is sent down the new chain first
        out = {p: ChainAddress(self.host, self._store.port, p, links[i], links[i + 1] if i + 1 < len(peers) else None,
                               self.backend, first, before, self.deadline_s, self.init_timeout_s)
               for i, p in enumerate(peers)}
        self._pending_head = (links[0], first)
        return out

    def accept_chain(self) -> None:
        """Join the new chain's first link (blocks until its head connects), then send it the
        latest version; the relay's thread serves from now on."""
        prefix, first = self._pending_head
        pg = _process_group(dist.PrefixStore(prefix, self._store), UP, self.backend, self.device,
                            self.init_timeout_s, self.deadline_s)
        head = _Link(pg, UP, self.deadline_s, self.stream)
        with self._lock:
            old, self._head, self._announcing = self._head, head, True
            self._queue = deque(item for item in self._queue if item[0] >= first)  # the new chain's seqs
            if not self._queue and self._versions:
                self._announce(next(reversed(self._versions)))
        if old is not None:
            old.close()
        self._start()

    def attach(self, peer: str) -> ChainAddress:
        """A receiver outside the chain (a replaced or added rollout worker): it fetches every
        version directly, those published before now when its WeightSync asks for them."""
        self._ensure_store()
        with self._lock:
            first, self._announcing = self._seq, True
            before = max(self._versions, default=-1)
        self._start()
        return ChainAddress(self.host, self._store.port, peer, None, None, self.backend, first, before,
                            self.deadline_s, self.init_timeout_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.deadline_s + 5)
        if self._head is not None:
            self._head.close()

    # internals

    def _ensure_store(self) -> None:
        if self._store is None:  # port 0: the OS picks a free port
            self._store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=self.init_timeout_s))

    def _announce(self, version: int) -> None:
        """(Under the lock.) Publish the header of `version` as the next seq and queue its send."""
        packed = self._versions[version]
        self._store.set(f"relay/h/{self._seq}", json.dumps(packed.header))
        self._store.set("relay/last", str(self._seq))
        if self._seq >= HEADERS_KEPT:  # the store keeps the latest headers only
            self._store.delete_key(f"relay/h/{self._seq - HEADERS_KEPT}")
        self._queue.append((self._seq, packed))
        self._seq += 1

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="relay", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        staging = _Staging(self.device, self.stream) if self.stream is not None else None
        while not self._stop.is_set():
            busy = False
            with self._lock:
                _, packed = self._queue.popleft() if self._queue else (None, None)
                head = self._head
                self._sending = packed is not None
            if packed is not None:
                busy = True
                try:
                    if head is not None and not head.dead:
                        self._push(head, packed, staging)
                finally:
                    self._finished()
            if self._store.check([f"relay/req/{self._served + 1}"]):
                busy = True
                with self._lock:
                    self._sending = True
                try:
                    self._serve_direct(self._served + 1)
                finally:
                    self._finished(served=1)
            if not busy:
                self._stop.wait(POLL_S)

    def _finished(self, served: int = 0) -> None:
        with self._done:
            self._served += served
            self._sending = False
            self._done.notify_all()

    def _requested(self) -> int:
        """Direct fetches asked for so far (their tickets are 1 .. this)."""
        return self._store.add("relay/req/n", 0) if self._store is not None else 0

    def _push(self, head: _Link, packed: Packed, staging) -> None:
        if packed.staged is not None:
            packed.staged.synchronize()
        try:
            _send_version(head, packed.header, packed.buckets, staging, with_header=False)
        except LinkLost as e:
            self.errors.append(f"version {packed.header['version']}: the chain's head is lost ({e}); "
                               "its receivers fetch directly")
            return
        self.counter.add_bytes("send", packed.nbytes, phase="sync")

    def _serve_direct(self, ticket: int) -> None:
        """One version to one receiver on a one-off gloo link, from the host buckets."""
        want = json.loads(self._store.get(f"relay/req/{ticket}").decode())
        self._store.delete_key(f"relay/req/{ticket}")
        try:
            pg = _process_group(dist.PrefixStore(f"relay/direct/{ticket}", self._store), UP, "gloo",
                                torch.device("cpu"), self.init_timeout_s, self.deadline_s)
        except Exception as e:
            self.errors.append(f"direct fetch {ticket} by {want['peer']}: never joined ({e})")
            return
        link = _Link(pg, UP, self.deadline_s)
        with self._lock:
            packed = self._versions.get(int(want["version"]))
        try:
            if packed is None:
                header = {"error": f"relay holds versions {self.versions}, not {want['version']}"}
                _send_version(link, {**header, "chunk": 1}, [], None, with_header=True)
                return
            if packed.staged is not None:
                packed.staged.synchronize()
            _send_version(link, packed.header, packed.buckets, None, with_header=True)
            self.counter.add_bytes("send", packed.nbytes, phase="sync")
        except LinkLost as e:
            self.errors.append(f"direct fetch {ticket} by {want['peer']}: lost ({e})")
        finally:
            link.close()

    def _get(self, version: int) -> Packed:
        with self._lock:
            if int(version) not in self._versions:
                raise KeyError(f"relay holds versions {list(self._versions)}, not {version} "
                               f"(it keeps the latest {self.keep})")
            return self._versions[int(version)]


class RelayClient:
    """A rollout worker's end of the chain: a thread receives every version into host buckets
    (forwarding each chunk downstream), `load` copies one into the module bucket by bucket."""

    def __init__(self, *, device: torch.device | str = "cpu", keep: int = 2, counter: Optional[CommCounter] = None):
        self.device = torch.device(device)
        self.keep = int(keep)
        self.counter = counter or CommCounter()  # "send" (forwarded) bytes, phase "sync"
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.address: Optional[ChainAddress] = None
        self.up: Optional[_Link] = None
        self.down: Optional[_Link] = None
        self.error: Optional[BaseException] = None  # what stopped the thread
        self.lost: list[str] = []  # links dropped (deadline missed, peer gone)
        self._staged: OrderedDict[int, tuple[dict, list[torch.Tensor]]] = OrderedDict()
        self._failed: dict[int, str] = {}
        self._received = 0  # payload bytes received since the last take_received
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._store = None

    def connect(self, address: ChainAddress) -> None:
        """Join the upstream and downstream links of this receiver (both neighbours connect at the
        same time; blocks until they have), then start receiving."""
        if address.backend != _backend_for(self.device):
            raise ValueError(f"relay speaks {address.backend}, this client's device is {self.device}")
        self.address = address
        self._store = dist.TCPStore(address.host, address.port, is_master=False, wait_for_workers=False,
                                    timeout=timedelta(seconds=address.init_timeout_s))
        joined: dict = {}

        def join(prefix, rank, key):
            try:
                pg = _process_group(dist.PrefixStore(prefix, self._store), rank, address.backend, self.device,
                                    address.init_timeout_s, address.deadline_s)
                joined[key] = _Link(pg, rank, address.deadline_s, self.stream)
            except Exception as e:  # noqa: BLE001 (raised below, on the caller's thread)
                joined[key] = e
        threads = [threading.Thread(target=join, args=(p, r, k)) for p, r, k in
                   ((address.up, DOWN, "up"), (address.down, UP, "down")) if p is not None]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for key in ("up", "down"):
            if isinstance(joined.get(key), Exception):
                raise joined[key]
        self.up, self.down = joined.get("up"), joined.get("down")
        self._thread = threading.Thread(target=self._loop, args=(address.first_seq,), name="relay-client",
                                        daemon=True)
        self._thread.start()

    def load(self, module: torch.nn.Module, version: int) -> int:
        """Copy `version` into `module`'s tensors in place, by name, bucket by bucket (the device
        holds one bucket besides the module); returns the payload bytes this receiver received
        since the previous load (what it got off the wire, skipped versions included). Raises on
        names the module lacks or shapes that differ, before anything is copied."""
        header, buckets = self._wait_for(int(version))
        own = module.state_dict()
        unknown = sorted(name for name, *_ in header["tensors"] if name not in own)
        if unknown:
            raise KeyError(f"relay payload names {len(unknown)} tensors the module lacks, e.g. {unknown[:3]}")
        wrong = [(n, tuple(s), tuple(own[n].shape)) for n, _, _, s in header["tensors"] if tuple(s) != tuple(own[n].shape)]
        if wrong:
            raise ValueError(f"relay payload shapes differ from the module's (name, sent, own): {wrong[:3]}")
        by_bucket: dict[int, list] = {}
        for name, b, offset, shape in header["tensors"]:
            by_bucket.setdefault(b, []).append((name, offset, shape))
        with torch.no_grad():
            for b, bucket in enumerate(buckets):
                dev = bucket.to(self.device, non_blocking=True) if self.device.type == "cuda" else bucket
                for name, offset, shape in by_bucket.get(b, []):
                    n = own[name].numel()
                    own[name].copy_(dev[offset: offset + n].view(shape))
                del dev
        return self.take_received()

    def take_received(self) -> int:
        with self._cond:
            n, self._received = self._received, 0
        return n

    @property
    def staged(self) -> list[int]:
        with self._cond:
            return list(self._staged)

    def close(self) -> None:
        self._stop.set()
        for link in (self.up, self.down):
            if link is not None:
                link.close()
        if self._thread is not None:
            self._thread.join(self.address.deadline_s + 5)

    # internals

    def _wait_for(self, version: int) -> tuple[dict, list[torch.Tensor]]:
        a = self.address
        if a is None:
            raise RuntimeError("load before connect")
        end = time.monotonic() + a.init_timeout_s  # then ask the relay itself (it says what it holds)
        with self._cond:
            while time.monotonic() < end:
                if version in self._staged:
                    return self._staged[version]
                if version in self._failed:
                    raise RuntimeError(f"relay: version {version} never arrived: {self._failed[version]}")
                if version <= a.before or (self._staged and version < max(self._staged)):
                    break  # published before this receiver joined, or already evicted: fetch it
                if self.error is not None:
                    raise RuntimeError(f"the relay client stopped: {self.error}") from self.error
                self._cond.wait(POLL_S * 20)
        header, buckets = self._fetch_direct(version, forward=False)
        with self._cond:
            self._received += payload_bytes(header)
        return header, buckets

    def _loop(self, seq: int) -> None:
        staging = _Staging(self.device, self.stream) if self.stream is not None else None
        try:
            while not self._stop.is_set():
                key = f"relay/h/{seq}"
                if not self._store.check([key]):
                    if self._store.check(["relay/last"]):  # fell behind the headers kept: skip on
                        seq = max(seq, int(self._store.get("relay/last").decode()) - HEADERS_KEPT + 1)
                    self._stop.wait(POLL_S)
                    continue
                header = json.loads(self._store.get(key).decode())
                seq += 1
                try:
                    buckets = self._receive(header, staging)
                except Exception as e:  # noqa: BLE001 (this version is lost; later ones may come)
                    with self._cond:
                        self._failed[header["version"]] = str(e)
                        self._cond.notify_all()
                    continue
                with self._cond:
                    self._staged.pop(header["version"], None)
                    self._staged[header["version"]] = (header, buckets)
                    while len(self._staged) > self.keep:
                        self._staged.popitem(last=False)
                    self._received += payload_bytes(header)
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 (load re-raises it)
            with self._cond:
                self.error = e
                self._cond.notify_all()

    def _receive(self, header: dict, staging) -> list[torch.Tensor]:
        """One announced version: from upstream (forwarding), or directly when upstream is gone."""
        if self.up is not None and not self.up.dead:
            buckets = self._alloc(header)
            forwarded = [0]
            try:
                self._relay(self.up, header, buckets, staging, forwarded)
                return buckets
            except LinkLost as e:
                self.lost.append(f"upstream, version {header['version']}: {e}")
                if forwarded[0] and self.down is not None:  # out of step: the next one refetches
                    self.down.close()
        _, buckets = self._fetch_direct(header["version"], forward=True, staging=staging)
        return buckets

    def _alloc(self, header: dict) -> list[torch.Tensor]:
        pin = self.device.type == "cuda"
        return [torch.empty(n, dtype=_dtype(d), pin_memory=pin) for d, n in header["buckets"]]

    def _relay(self, source: _Link, header: dict, buckets, staging, forwarded: list) -> None:
        """Receive every chunk from `source` into `buckets`, sending each on downstream if it is up
        (`forwarded[0]` counts the chunks sent on)."""
        down = self.down if self.down is not None and not self.down.dead else None
        on_device = staging is not None and source.stream is not None  # an NCCL source
        outgoing: deque = deque()
        for c in chunks(buckets, header["chunk"]):
            if on_device:
                with torch.cuda.stream(self.stream):
                    dev = staging.get(c)
                    source.wait(source.recv(dev))
                    c.copy_(dev, non_blocking=True)
            else:
                source.wait(source.recv(c))
                dev = c
                if down is not None and staging is not None:  # a gloo source (direct), NCCL downstream
                    with torch.cuda.stream(self.stream):
                        dev = staging.get(c)
                        dev.copy_(c, non_blocking=True)
            if down is not None:
                with _on(self.stream):
                    work = self._forward(down, dev)
                if work is None:
                    down = None  # downstream is gone: keep receiving, stop forwarding
                else:
                    outgoing.append(work)
                    forwarded[0] += 1
            while down is not None and len(outgoing) > 1:
                if not self._settle(down, outgoing.popleft()):
                    down = None
        while down is not None and outgoing:
            if not self._settle(down, outgoing.popleft()):
                down = None
        if self.stream is not None:
            self.stream.synchronize()  # the device-to-host copies are in the buckets
        if down is not None:
            self.counter.add_bytes("send", payload_bytes(header), phase="sync")

    def _forward(self, down: _Link, t: torch.Tensor):
        try:
            return down.send(t)
        except LinkLost as e:
            self.lost.append(f"downstream: {e}")
            return None

    def _settle(self, down: _Link, work) -> bool:
        if work is None:
            return False
        try:
            down.wait(work)
            return True
        except LinkLost as e:
            self.lost.append(f"downstream: {e}")
            return False

    def _fetch_direct(self, version: int, forward: bool, staging=None) -> tuple[dict, list[torch.Tensor]]:
        """Ask the relay for `version` on a one-off gloo link (and forward it if `forward` and the
        downstream link is still in step)."""
        a = self.address
        ticket = self._store.add("relay/req/n", 1)
        self._store.set(f"relay/req/{ticket}", json.dumps({"peer": a.peer, "version": int(version)}))
        pg = _process_group(dist.PrefixStore(f"relay/direct/{ticket}", self._store), DOWN, "gloo",
                            torch.device("cpu"), a.init_timeout_s, a.deadline_s)
        link = _Link(pg, DOWN, a.deadline_s)
        try:
            length = torch.zeros(1, dtype=torch.int64)
            link.wait(link.recv(length))
            raw = torch.empty(int(length.item()), dtype=torch.uint8)
            link.wait(link.recv(raw))
            header = json.loads(bytes(raw.numpy()).decode())
            if "error" in header:
                raise KeyError(header["error"])
            buckets = self._alloc(header)
            if forward:
                self._relay(link, header, buckets, staging, [0])
            else:
                for c in chunks(buckets, header["chunk"]):
                    link.wait(link.recv(c))
            return header, buckets
        finally:
            link.close()

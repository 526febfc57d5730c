"""The weight relay (digenrl.runtime.relay): trainer 0's relay sends each version once down a chain of
receivers over gloo, each forwarding it chunk by chunk; the receivers here are threads of this test
process (real gloo links over loopback) or, in the slow tests, spawned processes.

What must hold: received weights are bit-identical to the published state (fp32 and bf16, several
buckets, several chunks each); the bytes each sender counts equal `sim.collectives.relay_chain_sends`
(trainer 0 sends the payload once); a receiver that leaves mid-transfer does not keep the others
from loading the version (its downstream fetches it directly); a late joiner fetches directly;
bad payloads are refused before anything is copied.
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from digenrl.learner.comm import CommCounter
from digenrl.runtime.relay import LinkLost, Relay, RelayClient, chunks, pack, unpack
from digenrl.sim.collectives import relay_chain_links, relay_chain_sends

CAP = 2048  # bucket cap in bytes: small, so the tiny net below spans several buckets per dtype
CHUNK = 512  # several chunks per bucket: the pipelining unit
TIMEOUT_S = 30.0


class _Net(nn.Module):
    """fp32 and bf16 parameters (and an fp32 buffer), like a policy whose adapters mix dtypes."""

    def __init__(self, seed: int | None):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"fp32": nn.Linear(24, 16), "bf16": nn.Linear(16, 24).to(torch.bfloat16)})
            for _ in range(3))
        self.register_buffer("scale", torch.ones(7))
        g = torch.Generator().manual_seed(seed or 0)
        with torch.no_grad():
            for t in self.state_dict().values():  # seed None: zeros, so a load is visible
                t.copy_(torch.randn(t.shape, generator=g) if seed is not None else torch.zeros(t.shape))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits: equality here is bit-identity (NaN payloads and -0.0 included)."""
    ints = {4: torch.int32, 2: torch.int16, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() else t


def _assert_bit_identical(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert torch.equal(_bits(got[k]), _bits(want[k])), k


def _payload(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _relay(init_timeout_s: float = TIMEOUT_S, **kw) -> Relay:
    return Relay(bucket_bytes=CAP, chunk_bytes=CHUNK, counter=CommCounter(), deadline_s=TIMEOUT_S,
                 init_timeout_s=init_timeout_s, **kw)


def _chain(relay: Relay, n: int, client_cls=RelayClient, classes: dict = {}) -> list[RelayClient]:
    """n receivers r0 .. r{n-1} (threads of this process) joined to a new chain, in chain order;
    `classes`: a receiver's own class by name (default client_cls)."""
    peers = [f"r{i}" for i in range(n)]
    addresses = relay.open_chain(peers)
    clients = [classes.get(p, client_cls)(counter=CommCounter()) for p in peers]
    joining = [threading.Thread(target=c.connect, args=(addresses[p],)) for c, p in zip(clients, peers)]
    for t in joining:
        t.start()
    relay.accept_chain()
    for t in joining:
        t.join(TIMEOUT_S)
    return clients


def _close(relay: Relay, clients) -> None:
    for c in clients:
        c.close()
    relay.close()


def _load(client: RelayClient, version: int) -> tuple[int, dict]:
    net = _Net(seed=None)
    nbytes = client.load(net, version)
    return nbytes, {k: v.clone() for k, v in net.state_dict().items()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 4])
def test_chain_is_bit_identical_and_each_sender_counts_what_the_simulator_charges(n):
    relay = _relay()
    v1, v2 = _Net(seed=1).state_dict(), _Net(seed=2).state_dict()
    payload = _payload(v1)
    relay.put(1, v1)  # before the chain forms: the new chain gets it first
    dtypes = [d for d, _ in relay.layout(1)["buckets"]]
    assert dtypes.count("float32") >= 2 and dtypes.count("bfloat16") >= 2  # several buckets per dtype
    clients = _chain(relay, n)
    try:
        for c in clients:
            got, state = _load(c, 1)
            assert got == payload  # what this receiver took off the wire since its last load
            _assert_bit_identical(state, v1)
        assert relay.put(2, v2) == payload
        for c in clients:
            _assert_bit_identical(_load(c, 2)[1], v2)
        # per sender NIC, two versions: trainer 0 once each, every receiver but the tail once each
        assert relay.drain(TIMEOUT_S)  # its thread counts a send after the receivers may hold it
        counted = [relay.counter.take().get("comm/sync/send_bytes", 0)]
        counted += [c.counter.take().get("comm/sync/send_bytes", 0) for c in clients]
        assert counted == [2 * b for b in relay_chain_sends(payload, n)]
        assert sum(counted) == 2 * sum(relay_chain_links(payload, n))
        assert relay.errors == [] and all(c.lost == [] for c in clients)
    finally:
        _close(relay, clients)


@pytest.mark.timeout(60)
def test_drain_waits_for_the_relays_own_count(monkeypatch):
    # the relay's thread counts a send once it completes, which may be after the receiver holds
    # the version: held here by an event, so drain must report the send as not yet counted
    import digenrl.runtime.relay as relay_mod

    sent, release = threading.Event(), threading.Event()
    send = relay_mod._send_version

    def held(*args, **kwargs):
        out = send(*args, **kwargs)
        if threading.current_thread().name == "relay":
            sent.set()
            release.wait(TIMEOUT_S)
        return out

    monkeypatch.setattr(relay_mod, "_send_version", held)
    relay = _relay()
    v1 = _Net(seed=1).state_dict()
    relay.put(1, v1)
    clients = _chain(relay, 1)
    try:
        _assert_bit_identical(_load(clients[0], 1)[1], v1)
        assert sent.wait(TIMEOUT_S)
        assert not relay.drain(0.0) and "comm/sync/send_bytes" not in relay.counter.take()
        release.set()
        assert relay.drain(TIMEOUT_S)
        assert relay.counter.take()["comm/sync/send_bytes"] == _payload(v1)
    finally:
        release.set()
        _close(relay, clients)


class _Leaves(RelayClient):
    """A receiver that leaves after taking `after` chunks of version `version` off its upstream
    link: both its links close, its thread stops (a process gone mid-transfer, seen from the wire)."""

    version, after = 2, 3

    def _relay(self, source, header, buckets, staging, forwarded):
        if header["version"] != self.version:
            return super()._relay(source, header, buckets, staging, forwarded)
        for i, c in enumerate(chunks(buckets, header["chunk"])):
            if i == self.after:
                break
            source.wait(source.recv(c))
        self.up.close()
        if self.down is not None:
            self.down.close()
        self._stop.set()
        raise SystemExit  # the thread ends here, as a killed process would


@pytest.mark.timeout(60)
def test_a_receiver_leaving_mid_transfer_does_not_stop_the_others():
    # r0 -> r1 (leaves 3 chunks into version 2, having forwarded none) -> r2 -> r3. r0's forward
    # fails and it stops forwarding; r2 loses its upstream before it forwarded anything, so it
    # fetches version 2 from the relay directly and forwards it to r3 as usual.
    relay = _relay()
    v1, v2 = _Net(seed=1).state_dict(), _Net(seed=2).state_dict()
    payload = _payload(v1)
    relay.put(1, v1)
    clients = _chain(relay, 4, classes={"r1": _Leaves})
    try:
        for c in clients:
            _load(c, 1)
        assert relay.drain(TIMEOUT_S)  # version 1's send counted before the count is cleared
        relay.counter.take()
        t0 = time.monotonic()
        relay.put(2, v2)
        for c in (clients[0], clients[2], clients[3]):
            _assert_bit_identical(_load(c, 2)[1], v2)
        print(f"\nsurvivors loaded version 2 in {time.monotonic() - t0:.3f} s (deadline {TIMEOUT_S} s)")
        assert clients[0].lost and clients[0].lost[0].startswith("downstream")
        assert clients[2].lost and clients[2].lost[0].startswith("upstream")
        assert clients[3].lost == []
        # trainer 0 sent version 2 down the chain once, then directly to r2
        assert relay.drain(TIMEOUT_S)
        assert relay.counter.take()["comm/sync/send_bytes"] == 2 * payload
        relay.put(3, v1)  # the next version: r2 heads what is left of the chain below the break
        _assert_bit_identical(_load(clients[3], 3)[1], v1)
        _assert_bit_identical(_load(clients[0], 3)[1], v1)
    finally:
        _close(relay, clients)


@pytest.mark.timeout(60)
def test_a_late_joiner_fetches_directly_and_old_versions_are_refused_by_name():
    relay = _relay()
    for v in (1, 2, 3):
        relay.put(v, _Net(seed=v).state_dict())
    assert relay.versions == [2, 3]
    late = RelayClient()
    late.connect(relay.attach("late"))
    try:
        _assert_bit_identical(_load(late, 3)[1], _Net(seed=3).state_dict())  # published before it joined
        relay.put(4, _Net(seed=4).state_dict())  # after: announced, fetched by its thread
        _assert_bit_identical(_load(late, 4)[1], _Net(seed=4).state_dict())
        with pytest.raises(KeyError, match=r"holds versions \[3, 4\], not 1"):
            late.load(_Net(seed=None), 1)
    finally:
        _close(relay, [late])


@pytest.mark.timeout(60)
def test_unknown_names_and_wrong_shapes_are_refused_before_anything_is_copied():
    relay = _relay()
    good = _Net(seed=1).state_dict()
    relay.put(1, good)
    [client] = _chain(relay, 1)
    try:
        relay.put(2, {**good, "blocks.9.extra": torch.ones(3)})
        relay.put(3, {**good, "scale": torch.ones(8)})
        net = _Net(seed=None)
        with pytest.raises(KeyError, match="blocks.9.extra"):
            client.load(net, 2)
        with pytest.raises(ValueError, match="scale"):
            client.load(net, 3)
        assert all(not t.any() for t in net.state_dict().values())  # nothing was half-loaded
        relay.put(4, good)
        client.load(net, 4)
        _assert_bit_identical(net.state_dict(), good)
    finally:
        _close(relay, [client])


def test_pack_respects_the_cap_and_casts_only_floating_tensors():
    state = {"w": torch.randn(10, 10), "big": torch.randn(40, 40), "step": torch.arange(3), "b": torch.randn(10)}
    packed = pack(5, state, bucket_bytes=512, dtype=torch.bfloat16, chunk_bytes=100)
    per_bucket = {}
    for name, b, _, _ in packed.header["tensors"]:
        per_bucket.setdefault(b, []).append(name)
    for b, names in per_bucket.items():
        nbytes = packed.buckets[b].numel() * packed.buckets[b].element_size()
        assert nbytes <= 512 or len(names) == 1  # over the cap only a tensor alone in its bucket
    views = unpack(packed.header, packed.buckets)
    assert views["step"].dtype == torch.int64 and torch.equal(views["step"], state["step"])
    for k in ("w", "big", "b"):
        assert views[k].dtype == torch.bfloat16 and torch.equal(views[k], state[k].to(torch.bfloat16))
    assert packed.nbytes == 2 * (100 + 1600 + 10) + 8 * 3
    parts = chunks(packed.buckets, 100)
    assert all(c.numel() * c.element_size() <= 100 for c in parts)
    assert sum(c.numel() * c.element_size() for c in parts) == packed.nbytes


def test_a_closed_link_refuses_new_ops_by_raising_link_lost():
    from digenrl.runtime.relay import _Link

    class _Gone:
        def send(self, *a):
            raise RuntimeError("Connection closed by peer")

    link = _Link(_Gone(), 0, 1.0)
    with pytest.raises(LinkLost, match="closed by peer"):
        link.send(torch.zeros(1))
    assert link.dead
    with pytest.raises(LinkLost, match="was closed"):
        link.recv(torch.zeros(1))


# --- receivers in their own processes (slow: a spawn per receiver) ---


def _receiver(address, versions, out, die_at_version=None) -> None:
    """A rollout worker in its own process: connect, load `versions` in turn, hand back what it
    counted and loaded. `die_at_version`: SIGKILL itself once that version starts arriving."""
    torch.set_num_threads(1)
    client = RelayClient(counter=CommCounter())
    if die_at_version is not None:
        original = client._relay

        def dying(source, header, buckets, staging, forwarded):
            if header["version"] == die_at_version:
                source.wait(source.recv(chunks(buckets, header["chunk"])[0]))
                os.kill(os.getpid(), signal.SIGKILL)
            return original(source, header, buckets, staging, forwarded)
        client._relay = dying
    client.connect(address)
    got = []
    for v in versions:
        net = _Net(seed=None)
        nbytes = client.load(net, v)
        got.append((v, nbytes, {k: t.clone() for k, t in net.state_dict().items()}))
    buf = io.BytesIO()
    torch.save({"loaded": got, "counted": client.counter.take(), "lost": client.lost}, buf)
    out.put(buf.getvalue())
    client.close()


def _spawned_chain(relay, n, versions, die=None):
    ctx = mp.get_context("spawn")
    peers = [f"r{i}" for i in range(n)]
    addresses = relay.open_chain(peers)
    queues = [ctx.Queue() for _ in peers]
    procs = [ctx.Process(target=_receiver, daemon=True,
                         args=(addresses[p], versions, q, versions[-1] if die == i else None))
             for i, (p, q) in enumerate(zip(peers, queues))]
    for p in procs:
        p.start()
    relay.accept_chain()
    return procs, queues


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eight_receiver_processes_count_what_the_simulator_charges():
    n = 8
    relay = _relay(init_timeout_s=240.0)  # eight spawned processes import torch before they join
    v1, v2 = _Net(seed=1).state_dict(), _Net(seed=2).state_dict()
    payload = _payload(v1)
    relay.put(1, v1)
    procs, queues = _spawned_chain(relay, n, [1, 2])
    try:
        relay.put(2, v2)  # the receivers load 1, then 2
        results = [torch.load(io.BytesIO(q.get(timeout=240))) for q in queues]
        assert relay.drain(TIMEOUT_S)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        relay.close()
    for r in results:
        (_, b1, s1), (_, b2, s2) = r["loaded"]
        _assert_bit_identical(s1, v1)
        _assert_bit_identical(s2, v2)
        assert (b1, b2) == (payload, payload)
    counted = [relay.counter.take()["comm/sync/send_bytes"]] + [r["counted"].get("comm/sync/send_bytes", 0)
                                                               for r in results]
    assert counted == [2 * b for b in relay_chain_sends(payload, n)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_receiver_process_killed_mid_transfer():
    # 4 receiver processes, r1 SIGKILLs itself after the first chunk of version 2. The others
    # load version 2; the seconds they took are printed (the deadline bounds the wait).
    relay = Relay(bucket_bytes=CAP, chunk_bytes=CHUNK, counter=CommCounter(), deadline_s=5.0,
                  init_timeout_s=240.0)
    v1, v2 = _Net(seed=1).state_dict(), _Net(seed=2).state_dict()
    relay.put(1, v1)
    procs, queues = _spawned_chain(relay, 4, [1, 2], die=1)
    try:
        relay.put(2, v2)
        t0 = time.monotonic()
        survivors = [torch.load(io.BytesIO(queues[i].get(timeout=240))) for i in (0, 2, 3)]
        print(f"\nsurvivors of a receiver killed mid-transfer finished in {time.monotonic() - t0:.2f} s "
              f"(deadline 5.0 s), from the put of version 2")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        relay.close()
    assert procs[1].exitcode == -signal.SIGKILL
    for r in survivors:
        _assert_bit_identical(r["loaded"][-1][2], v2)


# --- CUDA (the gpu tier: pytest -m gpu, run by benchmarks/gpu_suite.py) ---


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_cuda_put_stages_on_the_relays_stream_before_the_trainer_overwrites():
    # put returns at once; the trainer's stream then overwrites the weights in place (the next
    # optimizer step). The staged version must hold the values of the put, not the overwrite:
    # the trainer's stream waits for the relay's copy, never the other way round.
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    relay = Relay(device="cuda", bucket_bytes=1 << 20, chunk_bytes=1 << 18)
    w = torch.randn(2048, 2048, device="cuda")
    want = w.to(torch.bfloat16).cpu()
    relay.put(1, {"w": w}, dtype=torch.bfloat16)
    w.mul_(0).add_(7)  # queued on the trainer's (default) stream right behind the put
    packed = relay._get(1)
    packed.staged.synchronize()
    got = unpack(packed.header, packed.buckets)["w"]
    assert torch.equal(got, want)
    assert packed.buckets[0].is_pinned()
    relay.close()


def _cuda_receiver(address, out) -> None:
    client = RelayClient(device="cuda:1")
    client.connect(address)
    net = nn.Linear(512, 512, bias=False).to("cuda:1")
    client.load(net, 1)
    out.put(net.weight.detach().cpu())
    client.close()


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_cuda_chain_over_nccl_to_a_second_gpu():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (an NCCL link needs one GPU per end)")
    relay = Relay(device="cuda:0", bucket_bytes=1 << 18, chunk_bytes=1 << 16, init_timeout_s=120.0)
    state = {"weight": torch.randn(512, 512, device="cuda:0")}
    relay.put(1, state)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    addresses = relay.open_chain(["r0"])
    p = ctx.Process(target=_cuda_receiver, args=(addresses["r0"], q), daemon=True)
    p.start()
    relay.accept_chain()
    try:
        assert torch.equal(q.get(timeout=240), state["weight"].cpu())
        assert relay.drain(TIMEOUT_S)
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
        relay.close()
    assert relay.counter.take()["comm/sync/send_bytes"] == 512 * 512 * 4

"""The weight relay (digenrl.runtime.relay): gloo pair groups between this test process (the
publishing trainer's rank 0) and rollout clients in spawned processes (or threads, for the
checks that need no second process).

What must hold: received weights are bit-identical to the published state (fp32 and bf16, several
buckets); `serve(v)` sends v even after v+1 was put; one relay serves several clients; serving runs
on its own thread and never blocks the owner's thread; bad payloads are refused by name.
"""

from __future__ import annotations

import io
import threading
from contextlib import contextmanager

import pytest
import torch
from torch import nn

from digenrl.learner.comm import CommCounter
from digenrl.runtime.relay import Relay, RelayClient, pack, unpack
from tests.helpers.ranks import rank_context

CAP = 2048  # bucket cap in bytes: small, so the tiny net below spans several buckets per dtype
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


def _client(address, go, n_receives: int, out) -> None:
    """A rollout worker: connect, wait for `go` (at most TIMEOUT_S), receive `n_receives` versions
    into a zeroed net, hand back [(version, bytes, state)] through `out` (torch.save bytes)."""
    torch.set_num_threads(1)
    net = _Net(seed=None)
    client = RelayClient(timeout_s=TIMEOUT_S)
    client.connect(address)
    if go is not None:
        go.wait(TIMEOUT_S)
    got = []
    for _ in range(n_receives):
        version, nbytes = client.receive(net)
        got.append((version, nbytes, {k: v.clone() for k, v in net.state_dict().items()}))
    buf = io.BytesIO()
    torch.save(got, buf)
    out.put(buf.getvalue())


@contextmanager
def _clients(specs):
    """Start one spawned `_client` per (address, go, n_receives); yields a function that returns
    client i's results. Clients still running at exit are killed."""
    ctx = rank_context()
    queues = [ctx.Queue() for _ in specs]
    procs = [ctx.Process(target=_client, args=(*spec, q), daemon=True) for spec, q in zip(specs, queues)]
    for p in procs:
        p.start()
    try:
        yield lambda i: torch.load(io.BytesIO(queues[i].get(timeout=TIMEOUT_S)))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


@pytest.mark.timeout(90)
def test_received_weights_are_bit_identical_fp32_bf16_several_buckets():
    counter = CommCounter()
    relay = Relay(bucket_bytes=CAP, counter=counter, timeout_s=TIMEOUT_S)
    published = _Net(seed=1).state_dict()
    put_bytes = relay.put(7, published)
    payload = sum(t.numel() * t.element_size() for t in published.values())
    assert put_bytes == payload  # no padding: buckets hold the tensors back to back

    dtypes = [d for d, _ in relay.layout(7)["buckets"]]
    assert dtypes.count("float32") >= 2 and dtypes.count("bfloat16") >= 2  # several buckets per dtype

    address = relay.open("rollout-0")
    with _clients([(address, None, 1)]) as results:
        relay.accept("rollout-0")
        sent = relay.serve("rollout-0", 7)
        [(version, received, state)] = results(0)
    assert (version, sent, received) == (7, payload, payload)
    _assert_bit_identical(state, published)
    assert counter.take() == {"comm/sync/send_bytes": payload, "comm/sync/send_calls": 1}


@pytest.mark.timeout(90)
def test_two_clients_from_one_relay_each_get_the_version_asked():
    relay = Relay(bucket_bytes=CAP, timeout_s=TIMEOUT_S)
    v1, v2 = _Net(seed=1).state_dict(), _Net(seed=2).state_dict()
    relay.put(1, v1)
    relay.put(2, v2)
    addresses = [relay.open("r0"), relay.open("r1")]
    assert addresses[0].prefix != addresses[1].prefix
    with _clients([(addresses[0], None, 1), (addresses[1], None, 2)]) as results:
        relay.accept("r0")
        relay.accept("r1")
        relay.serve("r1", 2)
        relay.serve("r0", 1)  # v2 was put after v1: v1 is still what r0 asked for
        relay.serve("r1", 1)
        r0, r1 = results(0), results(1)
    assert [v for v, _, _ in r0] == [1] and [v for v, _, _ in r1] == [2, 1]
    _assert_bit_identical(r0[0][2], v1)
    _assert_bit_identical(r1[0][2], v2)
    _assert_bit_identical(r1[1][2], v1)


@pytest.mark.timeout(90)
def test_serving_does_not_block_the_owners_thread():
    """The owner (trainer rank 0) keeps computing and publishes v2 while a serve of v1 waits on a
    client that has not asked yet; the client then still gets v1. Fails if serving held the GIL
    or the relay's lock across the sends (the owner's work would not run until the serve ended)."""
    relay = Relay(bucket_bytes=CAP, timeout_s=TIMEOUT_S)
    v1, v2 = _Net(seed=1).state_dict(), _Net(seed=2).state_dict()
    relay.put(1, v1)
    address = relay.open("r0")
    go = rank_context().Event()
    with _clients([(address, go, 1)]) as results:
        relay.accept("r0")
        serving = threading.Thread(target=relay.serve, args=("r0", 1), daemon=True)
        serving.start()

        x, w = torch.randn(64, 64), torch.randn(64, 64) / 8
        for _ in range(200):  # the owner's own work: a train step's worth of matmuls
            x = torch.tanh(x @ w)
        relay.put(2, v2)  # the next optimizer step publishes
        still_serving = serving.is_alive()
        go.set()  # only now does the client receive
        serving.join(TIMEOUT_S)
        [(version, _, state)] = results(0)
    assert still_serving, "the serve ended before the client asked: it cannot have overlapped the owner's work"
    assert not serving.is_alive()
    assert version == 1 and relay.versions == [1, 2]
    _assert_bit_identical(state, v1)


# --- one process, the client on a thread: protocol checks that need no second process ---


def _pair(relay: Relay, peer: str) -> RelayClient:
    client = RelayClient(timeout_s=TIMEOUT_S)
    joining = threading.Thread(target=client.connect, args=(relay.open(peer),))
    joining.start()
    relay.accept(peer)
    joining.join()
    return client


def _serve_to(relay: Relay, peer: str, version: int, receive):
    """Serve on a thread while `receive()` runs here; returns what receive returned."""
    serving = threading.Thread(target=relay.serve, args=(peer, version))
    serving.start()
    try:
        return receive()
    finally:
        serving.join(TIMEOUT_S)


@pytest.mark.timeout(60)
def test_relay_keeps_the_latest_two_versions():
    relay = Relay(bucket_bytes=CAP, timeout_s=TIMEOUT_S)
    for v in (1, 2, 3):
        relay.put(v, _Net(seed=v).state_dict())
    assert relay.versions == [2, 3]
    with pytest.raises(KeyError, match=r"holds versions \[2, 3\], not 1"):
        relay.serve("nobody", 1)  # refused before any send: no peer needed
    with pytest.raises(KeyError, match="no pair group"):
        relay.serve("nobody", 2)


@pytest.mark.timeout(60)
def test_unknown_names_and_wrong_shapes_are_refused_after_the_payload_is_drained():
    relay = Relay(bucket_bytes=CAP, timeout_s=TIMEOUT_S)
    good = _Net(seed=1).state_dict()
    relay.put(1, {**good, "blocks.9.extra": torch.ones(3)})
    relay.put(2, {**good, "scale": torch.ones(8)})
    client = _pair(relay, "r0")
    net = _Net(seed=None)
    with pytest.raises(KeyError, match="blocks.9.extra"):
        _serve_to(relay, "r0", 1, lambda: client.receive(net))
    with pytest.raises(ValueError, match="scale"):
        _serve_to(relay, "r0", 2, lambda: client.receive(net))
    assert all(not t.any() for t in net.state_dict().values())  # nothing was half-loaded
    relay.put(3, good)  # the pair is still in step: the next serve loads
    assert _serve_to(relay, "r0", 3, lambda: client.receive(net))[0] == 3
    _assert_bit_identical(net.state_dict(), good)


@pytest.mark.timeout(60)
def test_a_replaced_worker_gets_a_new_pair_group():
    relay = Relay(bucket_bytes=CAP, timeout_s=TIMEOUT_S)
    relay.put(1, _Net(seed=1).state_dict())
    first = _pair(relay, "r0")
    assert _serve_to(relay, "r0", 1, first.receive_state)[0] == 1
    second = _pair(relay, "r0")  # the same peer name opens again: a fresh prefix and group
    version, state, _ = _serve_to(relay, "r0", 1, second.receive_state)
    assert version == 1
    _assert_bit_identical(state, _Net(seed=1).state_dict())


def test_pack_respects_the_cap_and_casts_only_floating_tensors():
    state = {"w": torch.randn(10, 10), "big": torch.randn(40, 40), "step": torch.arange(3), "b": torch.randn(10)}
    packed = pack(5, state, bucket_bytes=512, dtype=torch.bfloat16)
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


# --- the deployment shape: the relay in a Ray actor's own concurrency group ---


class _Owner:
    """Trainer-0 rank 0 as the runtime hosts it: unit calls on the default group (one thread),
    the relay's calls on the "relay" group (another thread)."""

    def __init__(self):
        torch.set_num_threads(1)
        self.relay = Relay(bucket_bytes=CAP, timeout_s=TIMEOUT_S)
        self.relay.put(1, _Net(seed=1).state_dict())

    def step(self, version: int) -> int:
        """An optimizer step's worth of work, then a publish."""
        x, w = torch.randn(64, 64), torch.randn(64, 64) / 8
        for _ in range(200):
            x = torch.tanh(x @ w)
        return self.relay.put(version, _Net(seed=version).state_dict())

    def open(self, peer):
        return self.relay.open(peer)

    def accept(self, peer):
        self.relay.accept(peer)

    def serve(self, peer, version):
        return self.relay.serve(peer, version)


class _Rollout:
    def __init__(self):
        torch.set_num_threads(1)
        self.client, self.net = RelayClient(timeout_s=TIMEOUT_S), _Net(seed=None)

    def connect(self, address):
        self.client.connect(address)

    def receive(self):
        version, _ = self.client.receive(self.net)
        return version, {k: v.clone() for k, v in self.net.state_dict().items()}


@pytest.mark.timeout(120)
def test_a_ray_owner_keeps_stepping_while_its_relay_group_serves(ray_cluster):
    import ray

    owner = ray.remote(concurrency_groups={"relay": 1}, num_cpus=0)(_Owner).remote()
    rollout = ray.remote(num_cpus=0)(_Rollout).remote()

    def relay_call(method, *args):  # the relay's calls run on the actor's "relay" thread
        return getattr(owner, method).options(concurrency_group="relay").remote(*args)

    address = ray.get(relay_call("open", "r0"))
    ray.get([relay_call("accept", "r0"), rollout.connect.remote(address)])
    serving = relay_call("serve", "r0", 1)  # blocks in the relay group: the rollout has not asked
    assert ray.get(owner.step.remote(2), timeout=TIMEOUT_S) > 0  # the owner's unit runs meanwhile
    assert not ray.wait([serving], timeout=0)[0], "the serve ended before the rollout asked"
    version, state = ray.get(rollout.receive.remote(), timeout=TIMEOUT_S)
    ray.get(serving, timeout=TIMEOUT_S)
    assert version == 1
    _assert_bit_identical(state, _Net(seed=1).state_dict())

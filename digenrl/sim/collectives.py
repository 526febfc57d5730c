"""Communication costs: bytes on a link -> seconds, for collectives and weight transfers.

Every formula here is two steps, so that a new collective (FSDP all-gather /
reduce-scatter, HSDP all-reduce) is a new Traffic function and nothing else:

    *_traffic(payload bytes, ranks)  -> Traffic(bytes one rank sends, sequential messages)
    Traffic.seconds(link)            =  wire_s(bytes, link, messages)
                                     =  bytes / bandwidth + messages * latency

    ring all-reduce   2(n-1)/n * B     2(n-1) messages  (reduce-scatter + all-gather)
    ring all-gather   (n-1)/n * B      (n-1) messages per chunk (FSDP gathers layer by layer)
    pipelined bcast   B                one message per receiver (chunked chain)
    relay chain       B per sender     trainer 0 -> receiver 1 -> ... -> receiver N, chunk by chunk:
                                       every sender NIC but the tail's sends B once (relay_chain_*)
    all-to-all        (n-1)/n * B      (n-1) messages  (pairwise exchange; B: one rank's input)

The *_s functions return a `devices.Cost` (always estimated: no link was measured), zero
when there is nobody to talk to. The object-store path (Ray's default weight transfer)
crosses PCIe and host memory as well as the network, so it is priced in its three legs:
the sender's (object_store_send_s), the fan-out (object_store_fanout_s) and the
receiver's host -> device copy (pcie_s, also the optimizer offload's path). A trajectory row
takes the same path to one receiver (object_store_send_s, then object_store_pull_s).
CostModel.weight_sync_s sums them; the simulator's duration functions charge the
sender's leg to the trainer and the rest to the rollout.

This module knows links and devices only: what is sent (weight, gradient bytes) is the
caller's business (catalogue.BYTES_*, CostModel.weight_bytes).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from digenrl.sim.catalogue import Link, get_link
from digenrl.sim.devices import Cost, get_device

HOST_COPY_GBPS = 10.0  # serialising into Ray's object store: one host memcpy (estimate)
TCP_FRACTION = 0.5  # the object store moves bytes over TCP: half the NCCL rate of the link (estimate)


class Traffic(NamedTuple):
    """What one rank of a transfer puts on its link."""

    nbytes: float  # bytes sent by the busiest rank
    messages: int  # sequential messages, each paying the link latency once

    def seconds(self, link: str | Link) -> float:
        """Time on `link` (wire_s)."""
        return wire_s(self.nbytes, link, self.messages)


def wire_s(nbytes: float, link: str | Link, messages: int = 0) -> float:
    """Seconds to send nbytes over `link` in `messages` sequential messages: bytes / bw + messages * latency
    (messages=0: the bandwidth term alone, e.g. a sender feeding a pipelined chain)."""
    lk = get_link(link)
    return nbytes / (lk.gbps * 1e9) + messages * lk.latency_s


# ----------------------------------------------------------------------------- collectives


def allreduce_traffic(nbytes: float, n: int) -> Traffic:
    """Ring all-reduce of an nbytes tensor over n ranks: reduce-scatter then all-gather."""
    if n <= 1:
        return Traffic(0.0, 0)
    return Traffic(2 * (n - 1) / n * nbytes, 2 * (n - 1))


def allgather_traffic(nbytes: float, n: int, chunks: int = 1) -> Traffic:
    """Ring all-gather of a tensor whose gathered size is nbytes, in `chunks` separate
    collectives (FSDP: one per layer), each paying n-1 latencies."""
    if n <= 1:
        return Traffic(0.0, 0)
    return Traffic((n - 1) / n * nbytes, chunks * (n - 1))


def alltoall_traffic(nbytes: float, n: int, calls: int = 1) -> Traffic:
    """All-to-all over n ranks, `calls` of them, whose inputs add up to nbytes per rank: each rank
    keeps 1/n of its input and sends the rest, one pairwise message per peer and call."""
    if n <= 1:
        return Traffic(0.0, 0)
    return Traffic((n - 1) / n * nbytes, calls * (n - 1))


def broadcast_traffic(nbytes: float, n_receivers: int) -> Traffic:
    """Pipelined (chunked chain) broadcast: every link carries the bytes once; one latency per receiver."""
    if n_receivers <= 0:
        return Traffic(0.0, 0)
    return Traffic(nbytes, n_receivers)


# The weight relay (runtime/relay.py) packs a version into buckets of RELAY_BUCKET_BYTES and moves
# them in messages of at most RELAY_CHUNK_BYTES; a receiver forwards a chunk as soon as it has it,
# so each hop of the chain adds one chunk's time, not the payload's.
RELAY_BUCKET_BYTES = 64 << 20
RELAY_CHUNK_BYTES = 1 << 20
# NCCL's ring broadcast moves NCCL_BUFFSIZE / NCCL_STEPS = 4 MiB / 8 per pipeline step (its defaults).
NCCL_RING_STEP_BYTES = 512 << 10


def relay_chain_sends(nbytes: float, n_receivers: int) -> list[float]:
    """Bytes each sender NIC of the relay chain puts on the wire for one version: trainer 0's
    first, then receiver 1 .. N in chain order (the tail forwards nothing)."""
    if n_receivers <= 0:
        return [0.0]
    return [float(nbytes)] * n_receivers + [0.0]


def relay_chain_links(nbytes: float, n_receivers: int) -> list[float]:
    """Bytes on each link of the chain (trainer 0 -> r1, r1 -> r2, ...): the payload once each."""
    return [float(nbytes)] * max(n_receivers, 0)


def pipelined_chain_s(nbytes: float, link: str | Link, n_receivers: int, chunk_bytes: float) -> float:
    """A chunked store-and-forward chain over n_receivers hops: the head streams the payload
    (bytes / bw, the senders keep several chunks in flight so a message's latency overlaps the
    next), each further hop adds one chunk's time and every hop one latency."""
    lk = get_link(link)
    if n_receivers <= 0:
        return 0.0
    chunk = min(float(chunk_bytes), float(nbytes))
    return nbytes / (lk.gbps * 1e9) + (n_receivers - 1) * chunk / (lk.gbps * 1e9) + n_receivers * lk.latency_s


def relay_chain_s(nbytes: float, link: str | Link, n_receivers: int,
                  chunk_bytes: float = RELAY_CHUNK_BYTES) -> Cost:
    """The relay's chain (runtime/relay.py): one version reaches the last of n_receivers."""
    lk = get_link(link)
    if n_receivers <= 0:
        return Cost(0.0)
    return Cost(pipelined_chain_s(nbytes, lk, n_receivers, chunk_bytes), True, f"relay chain on {lk.name}")


def broadcast_candidates_s(nbytes: float, link: str | Link, n_receivers: int) -> dict[str, float]:
    """Seconds for one version to reach n_receivers, for each way the relay could send it:

    chain        our pair links, chunks of RELAY_CHUNK_BYTES (trainer 0's NIC sends the payload once)
    nccl-ring    one collective broadcast over a group of trainer 0 and the receivers: NCCL runs
                 it as a ring, a pipelined chain in NCCL_RING_STEP_BYTES steps (root sends once)
    binomial     a collective broadcast as a binomial tree (gloo's; an NCCL tree has no
                 broadcast): ceil(log2(N + 1)) rounds of the whole payload, the root sending in
                 every round
    """
    lk = get_link(link)
    rounds = math.ceil(math.log2(n_receivers + 1)) if n_receivers > 0 else 0
    return {"chain": pipelined_chain_s(nbytes, lk, n_receivers, RELAY_CHUNK_BYTES),
            "nccl-ring": pipelined_chain_s(nbytes, lk, n_receivers, NCCL_RING_STEP_BYTES),
            "binomial": rounds * (nbytes / (lk.gbps * 1e9) + lk.latency_s)}


def allreduce_s(nbytes: float, n: int, link: str | Link) -> Cost:
    """Ring all-reduce: 2(n-1)/n * bytes / bw + 2(n-1) * latency (reduce-scatter + all-gather)."""
    lk = get_link(link)
    if n <= 1:
        return Cost(0.0)
    return Cost(allreduce_traffic(nbytes, n).seconds(lk), True, f"ring allreduce on {lk.name}")


def allgather_s(nbytes: float, n: int, link: str | Link, chunks: int = 1) -> Cost:
    """Ring all-gather of a tensor whose full (gathered) size is nbytes: (n-1)/n * bytes / bw
    + chunks * (n-1) * latency."""
    lk = get_link(link)
    if n <= 1:
        return Cost(0.0)
    return Cost(allgather_traffic(nbytes, n, chunks).seconds(lk), True, f"ring allgather on {lk.name}")


def broadcast_s(nbytes: float, link: str | Link, n_receivers: int = 1) -> Cost:
    """Pipelined (chunked chain) broadcast: bytes / bw + one latency per receiver."""
    lk = get_link(link)
    if n_receivers <= 0:
        return Cost(0.0)
    return Cost(broadcast_traffic(nbytes, n_receivers).seconds(lk), True, f"pipelined broadcast on {lk.name}")


# ----------------------------------------------------------------------------- host <-> device, object store


def pcie_s(nbytes: float, device) -> float:
    """One copy between host and `device` over its PCIe (either direction; devices.Device.pcie_gbps)."""
    return nbytes / (get_device(device).pcie_gbps * 1e9)


def pageable_s(nbytes: float, device) -> float:
    """One copy between pageable (unpinned) host memory and `device`: the driver stages it through
    a pinned buffer, so it runs at the slower of PCIe and one host memcpy (HOST_COPY_GBPS)."""
    return nbytes / (min(get_device(device).pcie_gbps, HOST_COPY_GBPS) * 1e9)


# A single controller's batch dispatch (verl's DataProto: torch.save into memory, then torch.load),
# measured by verl itself on a 6400 x 20480 batch (int64 token ids assumed: 1.05 GB): serialize 2.58 s,
# deserialize 0.74 s (verl-project/verl pull request 3425, the "tensor" baseline).
DATAPROTO_SERIALIZE_GBPS = 6400 * 20480 * 8 / 2.58 / 1e9  # 0.41
DATAPROTO_DESERIALIZE_GBPS = 6400 * 20480 * 8 / 0.74 / 1e9  # 1.42


def driver_dispatch_s(nbytes: float, workers: int, outbound: bool) -> float:
    """A whole batch of nbytes through one controller process to (outbound) or from `workers`
    workers: the controller (de)serializes all of it, each worker its 1/workers share in parallel."""
    share = nbytes / max(1, workers)
    if outbound:
        return (nbytes / DATAPROTO_SERIALIZE_GBPS + share / DATAPROTO_DESERIALIZE_GBPS) / 1e9
    return (share / DATAPROTO_SERIALIZE_GBPS + nbytes / DATAPROTO_DESERIALIZE_GBPS) / 1e9


def object_store_send_s(nbytes: float, sender_device) -> float:
    """Sender's leg of an object-store transfer: device -> host over the sender's PCIe, then one
    host memcpy into the store (HOST_COPY_GBPS)."""
    return pcie_s(nbytes, sender_device) + nbytes / (HOST_COPY_GBPS * 1e9)


def object_store_pull_s(nbytes: float, link: str | Link | None, receiver_device) -> float:
    """Receiver's leg of one object fetched from another worker's store (a trajectory row, the
    trainer's task arguments): one hop over `link` at TCP_FRACTION of its rate (None: the same
    node, no wire), one host memcpy out of the store, host -> device over the receiver's PCIe."""
    wire = 0.0
    if link is not None:
        lk = get_link(link)
        wire = nbytes / (TCP_FRACTION * lk.gbps * 1e9) + lk.latency_s
    return wire + nbytes / (HOST_COPY_GBPS * 1e9) + pcie_s(nbytes, receiver_device)


def object_store_hops(n_receivers: int, gpus_per_node: int) -> int:
    """Network hops of a binary-tree fan-out to the receivers' nodes: ceil(log2(nodes + 1))."""
    nodes = math.ceil(n_receivers / gpus_per_node)
    return math.ceil(math.log2(nodes + 1))


def object_store_fanout_s(nbytes: float, link: str | Link, n_receivers: int, gpus_per_node: int) -> float:
    """Store -> receiving nodes: each tree hop sends the bytes over `link` at TCP_FRACTION of its rate."""
    lk = get_link(link)
    hops = object_store_hops(n_receivers, gpus_per_node)
    return hops * (nbytes / (TCP_FRACTION * lk.gbps * 1e9) + lk.latency_s)


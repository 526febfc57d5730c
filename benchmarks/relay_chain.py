"""How the weight relay sends a version, and what a lost receiver costs.

    python benchmarks/relay_chain.py [--measure-mb 16] [--receivers 4] [--deadline 5]

1. The simulator's figures (sim.collectives.broadcast_candidates_s) for one version reaching 64
   and 512 receivers over 400 Gb/s InfiniBand, for the catalogue's bf16 payloads: our chain of
   pair links (RELAY_CHUNK_BYTES chunks), one collective broadcast as NCCL runs it (a ring: the
   same pipelined chain in 512 KiB steps) and as a binomial tree (gloo's broadcast), with the
   bytes trainer 0's NIC sends for each.
2. Measured here (gloo over loopback, receivers as threads of this process): the seconds from
   `put` until every receiver has loaded the version, with every receiver healthy, then with
   one receiver in the middle leaving after its first chunk of a version (its downstream fetches
   that version directly), then the next version.
"""

from __future__ import annotations

import argparse
import threading
import time

import torch

from digenrl.learner.comm import CommCounter
from digenrl.runtime.relay import Relay, RelayClient, chunks
from digenrl.sim.catalogue import BYTES_WEIGHT, get_model
from digenrl.sim.collectives import RELAY_CHUNK_BYTES, broadcast_candidates_s

MODELS = ("flux.1-12b", "qwen-image-20b", "wan2.1-14b")


def simulated() -> None:
    print(f"== simulated: one version to N receivers over ib-400g (chain chunks {RELAY_CHUNK_BYTES >> 10} KiB)")
    print(f"{'model':16s} {'GB':>6s} {'N':>4s} {'chain s':>8s} {'nccl-ring s':>11s} {'binomial s':>10s}"
          f"  trainer-0 NIC GB: chain / ring / binomial")
    for name in MODELS:
        nbytes = BYTES_WEIGHT * get_model(name).params_B * 1e9
        for n in (64, 512):
            c = broadcast_candidates_s(nbytes, "ib-400g", n)
            rounds = (n).bit_length() if n & (n + 1) else (n + 1).bit_length() - 1  # ceil(log2(n + 1))
            print(f"{name:16s} {nbytes / 1e9:6.1f} {n:4d} {c['chain']:8.3f} {c['nccl-ring']:11.3f} "
                  f"{c['binomial']:10.3f}  {nbytes / 1e9:.1f} / {nbytes / 1e9:.1f} / {rounds * nbytes / 1e9:.1f}")


class _Leaves(RelayClient):
    """Leaves (closes both links, stops) after its first chunk of version 3."""

    def _relay(self, source, header, buckets, staging, forwarded):
        if header["version"] != 3:
            return super()._relay(source, header, buckets, staging, forwarded)
        source.wait(source.recv(chunks(buckets, header["chunk"])[0]))
        self.up.close()
        if self.down is not None:
            self.down.close()
        self._stop.set()
        raise SystemExit


def measured(mb: int, n: int, deadline: float) -> None:
    state = {f"w{i}": torch.randn(mb * (1 << 20) // 4 // 8) for i in range(8)}  # 8 fp32 tensors, `mb` MB
    relay = Relay(counter=CommCounter(), deadline_s=deadline, init_timeout_s=60.0)
    relay.put(1, state)
    peers = [f"r{i}" for i in range(n)]
    addresses = relay.open_chain(peers)
    clients = [(_Leaves if i == 1 else RelayClient)() for i in range(n)]
    joining = [threading.Thread(target=c.connect, args=(addresses[p],)) for c, p in zip(clients, peers)]
    for t in joining:
        t.start()
    relay.accept_chain()
    for t in joining:
        t.join()
    nets = [{k: torch.zeros_like(v) for k, v in state.items()} for _ in peers]

    class _M(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            for k, v in d.items():
                self.register_buffer(k, v)

    mods = [_M(d) for d in nets]
    for c, m in zip(clients, mods):
        c.load(m, 1)
    print(f"\n== measured here: {mb} MB payload, {n} receivers (threads), gloo over loopback, "
          f"chunks {RELAY_CHUNK_BYTES >> 10} KiB, deadline {deadline} s")
    for version, who in ((2, "healthy chain"), (3, "r1 leaves after its first chunk"),
                         (4, "the next version (r2 fetches directly, forwards)")):
        t0 = time.monotonic()
        relay.put(version, state)
        for i, (c, m) in enumerate(zip(clients, mods)):
            if i != 1 or version < 3:
                c.load(m, version)
        print(f"{who:50s} {time.monotonic() - t0:7.3f} s   (put -> every live receiver loaded it)")
    for c in clients:
        c.close()
    relay.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure-mb", type=int, default=16)
    ap.add_argument("--receivers", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=5.0)
    args = ap.parse_args()
    simulated()
    measured(args.measure_mb, args.receivers, args.deadline)


if __name__ == "__main__":
    main()

"""GPU check of the weight relay beside a training step: does publishing hold the trainer?

    python benchmarks/gpu_relay_check.py                 # CUDA: a ~0.5B-parameter bf16 MLP
    python benchmarks/gpu_relay_check.py --tiny          # CPU (gloo), tiny: the wiring only

A "trainer step" is forward + backward + SGD on a stack of square layers. It is timed alone, then
with a publish after every step (`Relay.put`: the device-to-host copy into pinned buckets on the
relay's own stream; the relay's thread then sends it down the chain), each over the same number
of steps. With two or more GPUs a receiver process on the second GPU loads every version over
NCCL; with one GPU there is no receiver and only the staging runs beside the step (said in the
output); on the CPU a receiver thread over gloo.

Host syncs per step (CUDA): `torch.cuda.set_sync_debug_mode("warn")` during the steps, each
synchronizing call counted by the thread that made it: the trainer's thread (should not grow
with a publish: `put` never waits) and the relay's threads (which may wait, off the trainer's
stream). The timing's own end-of-step synchronize is outside the counted region.

Prints one JSON line: step_ms_alone, step_ms_publish, slowdown (publish / alone),
publish_MB, receivers, host_syncs_per_step {trainer_alone, trainer_publish, relay_threads}.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import warnings

import torch
from torch import nn

from digenrl.runtime.relay import Relay, RelayClient


def _model(width: int, layers: int, device, dtype) -> nn.Module:
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(layers)]).to(device, dtype)


def _receiver(address, device: str, width: int, layers: int, last: int, ready) -> None:
    """A rollout worker on `device` (a spawned process): its thread receives every version; it
    loads the last one into its own copy of the model."""
    client = RelayClient(device=device)
    client.connect(address)
    ready.set()
    client.load(_model(width, layers, device, torch.bfloat16), last)
    client.close()


class _SyncCounter:
    """Counts torch's sync-debug warnings by the thread that raised them."""

    def __init__(self):
        self.by_thread: dict[str, int] = {}

    def __enter__(self):
        self._old = warnings.showwarning
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("always")

        def show(message, category, *a, **k):
            if "synchroniz" in str(message).lower():
                name = threading.current_thread().name
                self.by_thread[name] = self.by_thread.get(name, 0) + 1
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._old
        self._cm.__exit__(*exc)
        return False


def run(args) -> dict:
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda:0" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    width, layers, batch = (8192, 8, 4096) if cuda else (128, 4, 32)
    model = _model(width, layers, device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(batch, width, device=device, dtype=dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().pow(2).mean().backward()
        opt.step()

    relay = Relay(device=device, deadline_s=60.0, init_timeout_s=120.0)
    n_gpus = torch.cuda.device_count() if cuda else 0
    receivers, procs, note = 0, [], ""
    relay.put(0, {k: v.detach() for k, v in model.state_dict().items()}, dtype=torch.bfloat16)
    if cuda and n_gpus >= 2:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        addresses = relay.open_chain(["r0"])
        ready = ctx.Event()
        procs = [ctx.Process(target=_receiver, args=(addresses["r0"], "cuda:1", width, layers, args.steps, ready),
                             daemon=True)]
        procs[0].start()
        relay.accept_chain()
        receivers = 1
    elif not cuda:
        addresses = relay.open_chain(["r0"])
        client = RelayClient()
        t = threading.Thread(target=client.connect, args=(addresses["r0"],))
        t.start()
        relay.accept_chain()
        t.join()
        receivers = 1
    else:
        note = "one GPU: no receiver; the staging copies on the relay's stream run beside the step, no sends"

    for _ in range(args.warmup):
        step()
    sync()

    def timed(publish: bool) -> tuple[float, dict]:
        counts = _SyncCounter() if cuda else None
        elapsed = 0.0
        for i in range(args.steps):
            t0 = time.perf_counter()
            if counts is not None:
                with counts:
                    step()
                    if publish:
                        relay.put(1 + i, {k: v.detach() for k, v in model.state_dict().items()}, dtype=torch.bfloat16)
            else:
                step()
                if publish:
                    relay.put(1 + i, {k: v.detach() for k, v in model.state_dict().items()}, dtype=torch.bfloat16)
            sync()
            elapsed += time.perf_counter() - t0
        return elapsed / args.steps, (counts.by_thread if counts is not None else {})

    alone_s, alone_syncs = timed(False)
    publish_s, publish_syncs = timed(True)
    if not cuda:  # the CPU receiver loads the last version: the chain did deliver
        net = _model(width, layers, "cpu", torch.float32)
        client.load(net, args.steps)
        client.close()
    for p in procs:
        p.join(timeout=120)
    relay.close()
    main = threading.main_thread().name
    per = max(1, args.steps)
    payload = sum(v.numel() * 2 for v in model.state_dict().values())
    return {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "gpus": n_gpus, "receivers": receivers,
            "note": note, "steps": args.steps, "publish_MB": payload / 1e6,
            "step_ms_alone": 1e3 * alone_s, "step_ms_publish": 1e3 * publish_s, "slowdown": publish_s / alone_s,
            "host_syncs_per_step": None if not cuda else {
                "trainer_alone": alone_syncs.get(main, 0) / per,
                "trainer_publish": publish_syncs.get(main, 0) / per,
                "relay_threads": sum(n for k, n in publish_syncs.items() if k != main) / per}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU (gloo), tiny shapes: the wiring only")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    print(json.dumps(run(ap.parse_args())))


if __name__ == "__main__":
    main()

"""How fast does this host pickle a batch the way verl's single controller does?

    python benchmarks/dataproto_serialize.py [--samples 128] [--repeats 3]

The shipped verl-lineage rows (veRL-Omni, mm_grpo) pay whole-batch dispatches through one
driver process at verl's own measured DataProto rates (collectives.DATAPROTO_*_GBPS: 0.41 GB/s
serialize, 1.42 GB/s deserialize, read from verl PR 3425 as an int64 batch). This measures the
same path on your host: a dict of tensors shaped like one mm_grpo chunk (per sample: an fp32
512x512 image, 10 fp16 latents of 16x64x64, prompt and negative embeddings of 589x4096 fp16,
14.1 MB), made contiguous (verl consolidates first), `torch.save` into memory, `getvalue()`,
then `torch.load` back. Prints GB/s beside the constants the simulator uses, so the largest
inferred term of the mm_grpo figures can be checked on a real host.
"""

from __future__ import annotations

import argparse
import io
import time

import torch

from digenrl.sim.collectives import DATAPROTO_DESERIALIZE_GBPS, DATAPROTO_SERIALIZE_GBPS


def batch(samples: int) -> dict[str, torch.Tensor]:
    """One mm_grpo-shaped chunk of `samples` samples (see the module doc)."""
    g = torch.Generator().manual_seed(0)
    return {
        "responses": torch.rand(samples, 3, 512, 512, generator=g),
        "latents": torch.rand(samples, 10, 16, 64, 64, generator=g).half(),
        "prompt_embeds": torch.rand(samples, 589, 4096, generator=g).half(),
        "negative_prompt_embeds": torch.rand(samples, 589, 4096, generator=g).half(),
    }


def measure(samples: int, repeats: int) -> dict[str, float]:
    """Best-of-`repeats` seconds to serialize and deserialize one chunk, and its bytes."""
    data = batch(samples)
    nbytes = sum(t.numel() * t.element_size() for t in data.values())
    ser, de = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save({k: v.contiguous().clone() for k, v in data.items()}, buf)  # consolidate + save
        blob = buf.getvalue()
        t1 = time.perf_counter()
        torch.load(io.BytesIO(blob))
        t2 = time.perf_counter()
        ser.append(t1 - t0)
        de.append(t2 - t1)
    return {"bytes": nbytes, "serialize_s": min(ser), "deserialize_s": min(de)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=128, help="samples in the chunk (mm_grpo: 128 per GPU)")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    r = measure(a.samples, a.repeats)
    gb = r["bytes"] / 1e9
    print(f"chunk: {a.samples} samples, {gb:.2f} GB")
    print(f"serialize:   {r['serialize_s']:.2f} s = {gb / r['serialize_s']:.2f} GB/s "
          f"(simulator: {DATAPROTO_SERIALIZE_GBPS:.2f})")
    print(f"deserialize: {r['deserialize_s']:.2f} s = {gb / r['deserialize_s']:.2f} GB/s "
          f"(simulator: {DATAPROTO_DESERIALIZE_GBPS:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

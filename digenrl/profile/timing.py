"""Timing and peak memory of one measured call: median of repeats, CUDA events on a GPU."""

from __future__ import annotations

import gc
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

GIB = 2.0**30
RSS_NOTE = "peak_GB = process RSS high-water mark (VmHWM), not an allocator peak"


def timer(device: torch.device, warmup: int, iters: int) -> Callable[..., float]:
    """Median milliseconds of fn over `iters` runs after `warmup` (CUDA events on a GPU).

    The returned `run(fn, before=None)` calls `before()` untimed ahead of every run of fn
    (warmup included): the set-up a repeat needs, e.g. gradients for an optimizer step.
    """

    def run(fn: Callable[[], Any], before: Optional[Callable[[], Any]] = None) -> float:
        for _ in range(warmup):
            if before is not None:
                before()
            fn()
        times = []
        for _ in range(iters):
            if before is not None:
                before()
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize(device)
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    return run


class PeakMemory:
    """Peak GiB since reset(). CUDA: the caching allocator's max_memory_allocated (weights
    included, as in the calibration file). CPU on Linux: the process RSS high-water mark
    (VmHWM, reset through /proc/self/clear_refs), which includes the interpreter and
    libraries; None where it cannot be reset."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu_resettable = device.type != "cuda" and os.access("/proc/self/clear_refs", os.W_OK)
        self.note = "" if device.type == "cuda" else RSS_NOTE

    def reset(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.cpu_resettable:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)

    def read(self) -> Optional[float]:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / GIB
        if not self.cpu_resettable:
            return None
        m = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        return int(m.group(1)) * 1024 / GIB if m else None


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()

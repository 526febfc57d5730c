"""Ordering test events across processes without sleeping: a gate is a file that exists or not.

A Ray actor (or a Serve replica) holds at `wait()` until the test process, or a hook in the
driver, calls `open()`. Waiting polls the file system with a deadline and fails naming what
it waited for, so a broken ordering fails the test instead of hanging it; nothing assumes a
duration is "long enough".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileGate:
    path: Path

    def open(self) -> None:
        Path(self.path).touch()

    def is_open(self) -> bool:
        return Path(self.path).exists()

    def wait(self, deadline_s: float, why: str) -> None:
        """Return once the gate is open; raise TimeoutError(`why`) after `deadline_s`."""
        end = time.monotonic() + deadline_s
        while not self.is_open():
            if time.monotonic() > end:
                raise TimeoutError(f"{why} (gate {self.path} still closed after {deadline_s:.0f} s)")
            time.sleep(0.005)

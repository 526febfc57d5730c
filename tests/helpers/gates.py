"""Ordering test events across processes without sleeping (Ray actors, Serve replicas, the CLI).

    gate = FileGate(tmp_path / "gate")   # closed; a plain path, so a pickled callee carries it
    callee:     gate.pass_through()      # appends to "inside", then blocks until "open" exists
    test side:  gate.wait_inside(1)      # a call is running now, and stays so
                gate.open()              # it returns

Every wait polls a condition up to a deadline and then fails naming what it waited for, so a
broken ordering fails the test with a message instead of hanging it, and no test relies on a
duration being "long enough".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.01


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Return once condition() is true; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


class FileGate:
    """A gate in a directory: `open` (a file) lets calls through; `inside` logs one line per entry."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        os.makedirs(self.path, exist_ok=True)

    def open(self) -> None:
        Path(self.path, "open").touch()

    def is_open(self) -> bool:
        return os.path.exists(os.path.join(self.path, "open"))

    def entered(self) -> int:
        """How many calls have reached the gate (passed or still waiting)."""
        log = Path(self.path, "inside")
        return len(log.read_text().split()) if log.exists() else 0

    def pass_through(self, timeout_s: float = 120.0) -> None:
        """Mark this call inside (one small O_APPEND write: atomic across processes), then wait for open()."""
        with open(os.path.join(self.path, "inside"), "a") as f:
            f.write(f"{os.getpid()}\n")
        wait_until(self.is_open, f"gate {self.path} to open", timeout_s)

    def wait_inside(self, n: int = 1, timeout_s: float = 60.0) -> None:
        wait_until(lambda: self.entered() >= n, f"{n} call(s) to reach gate {self.path}", timeout_s)

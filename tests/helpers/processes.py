"""Killing a test run's worker processes, and knowing they are dead."""

from __future__ import annotations

import time

import psutil


def kill_and_wait(pid: int, deadline_s: float = 30.0) -> None:
    """SIGKILL `pid` and return once it has exited (gone, or a zombie its parent has not reaped).

    A fault-injection test kills a worker right before the driver sends it a unit: the unit
    must find the process dead, not race it. Raises with the pid if it is still alive after
    `deadline_s`."""
    proc = psutil.Process(pid)
    proc.kill()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still running {deadline_s:.0f} s after SIGKILL")

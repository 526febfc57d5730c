"""Killing a test run's worker processes, and knowing they are dead."""

from __future__ import annotations

import psutil

from tests.helpers.gates import wait_until


def kill_and_wait(pid: int, deadline_s: float = 30.0) -> None:
    """SIGKILL `pid` and return once it has exited (gone, or a zombie its parent has not reaped).

    A fault-injection test kills a worker right before the driver sends it a unit: the unit
    must find the process dead, not race it. Raises with the pid if it is still alive after
    `deadline_s`."""
    proc = psutil.Process(pid)
    proc.kill()

    def exited() -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(exited, f"process {pid} to exit after SIGKILL", deadline_s)

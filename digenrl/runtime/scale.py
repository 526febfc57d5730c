"""Scale requests: how `digenrl scale` talks to a running driver, through the run directory.

    digenrl scale --run-dir DIR rollout=+4            the driver (runtime/elastic.py)
      read DIR/pools.json (is a run live? its pools)   writes DIR/pools.json at start and after
      validate, then write DIR/scale/<id>.json         every change; removes it at the end
        (tmp file + os.replace: never read half)       polls DIR/scale/ every ~0.5 s, consumes
                                                       each request once (deletes it) and answers
                                                       one JSON line per event in DIR/scale.log

Requests: `rollout=+N` adds N rollout workers, `rollout=-N` drains N, `rollout=N` sets the
pool to N (adds or drains the difference). Only the rollout pool scales (trainers hold
optimizer state). No Ray here: the CLI validates without starting it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

ROLES = ("rollout",)  # pools that can grow and shrink in a running job
STATE = "pools.json"
REQUESTS = "scale"
LOG = "scale.log"

_SPEC = re.compile(r"^(?P<role>[a-z_]+)=(?P<sign>[+-]?)(?P<n>.*)$")


class ScaleError(ValueError):
    """A request that cannot be made or carried out; the message names what is wrong."""


@dataclass(frozen=True)
class ScaleRequest:
    """`op` '+' adds n workers, '-' drains n, '=' sets the pool to n workers."""

    role: str
    op: str
    n: int
    allow_empty: bool = False  # may drain the last rollout worker (TAG modes only)

    def target(self, current: int) -> int:
        """Pool size after this request, from `current` workers."""
        return {"+": current + self.n, "-": current - self.n, "=": self.n}[self.op]

    def __str__(self) -> str:
        return f"{self.role}={'' if self.op == '=' else self.op}{self.n}"


def parse_request(spec: str, allow_empty: bool = False) -> ScaleRequest:
    """'rollout=+4' / 'rollout=-2' / 'rollout=6' -> ScaleRequest; ScaleError names what is wrong."""
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ScaleError(f"{spec!r}: expected ROLE=+N, ROLE=-N or ROLE=N, e.g. rollout=+4")
    role, sign, n = m["role"], m["sign"], m["n"]
    if role not in ROLES:
        why = " (trainers hold optimizer state: restart from a checkpoint with more instead)" \
            if role in ("trainer", "colocated") else ""
        raise ScaleError(f"{spec!r}: role {role!r} cannot scale in a running job{why}; "
                         f"allowed: {', '.join(ROLES)}")
    if not n.isdigit():
        raise ScaleError(f"{spec!r}: {n!r} is not a whole number of workers")
    if sign and int(n) == 0:
        raise ScaleError(f"{spec!r}: {sign}0 changes nothing")
    return ScaleRequest(role, sign or "=", int(n), allow_empty)


# -- the driver's state file -----------------------------------------------------------------
def write_state(run_dir: Path, state: dict) -> None:
    """The live driver's pools (atomic replace), with its pid and host."""
    state = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), **state}
    _write_atomic(Path(run_dir) / STATE, json.dumps(state, indent=1))


def clear_state(run_dir: Path) -> None:
    try:
        (Path(run_dir) / STATE).unlink()
    except FileNotFoundError:
        pass


def read_state(run_dir: Path) -> dict:
    """The running driver's pools.json; ScaleError when DIR holds no running run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ScaleError(f"run directory {run_dir} does not exist")
    path = run_dir / STATE
    if not path.exists():
        raise ScaleError(f"no running run in {run_dir}: {STATE} is written by a running "
                         "`digenrl train` in a Ray mode (run.mode=local does not scale)")
    state = json.loads(path.read_text())
    if state.get("host") == socket.gethostname() and not _alive(state.get("pid")):
        raise ScaleError(f"the run that wrote {path} (pid {state.get('pid')}) is no longer "
                         "running; its pools cannot change")
    return state


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, TypeError, ValueError):
        return True  # someone else's process, or unknown: do not refuse on a guess
    return True


# -- requests ----------------------------------------------------------------------------------
def pending(run_dir: Path) -> list[tuple[Path, ScaleRequest]]:
    """Requests written and not consumed yet, oldest first (names sort by time)."""
    d = Path(run_dir) / REQUESTS
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("*.json")):
        try:
            out.append((p, ScaleRequest(**json.loads(p.read_text()))))
        except (OSError, ValueError, TypeError):  # consumed meanwhile, or not ours
            continue
    return out


def check_request(req: ScaleRequest, state: dict, queued: list[ScaleRequest] = ()) -> tuple[int, int]:
    """(workers now, workers after `req` and the `queued` requests before it) of req.role;
    ScaleError when the pool would go below its minimum or the run cannot add workers."""
    now = len(state.get(req.role, [])) + len(state.get("joining", []))
    if req.role == "rollout" and state.get("mode") == "colocated":
        raise ScaleError("run.mode=colocated has no rollout pool: every worker generates and trains")
    prior = now  # once the queued requests are carried out
    for q in queued:
        if q.role == req.role:
            prior = q.target(prior)
    after = req.target(prior)
    if after > prior and req.role == "rollout" and not state.get("can_add_rollout", True):
        raise ScaleError("this run started without rollout workers, so its trainers publish no "
                         "weights for them; start it with runtime.rollout.workers >= 1 to scale")
    lowest = 0 if (req.allow_empty and state.get("tag")) else 1
    if after < lowest:
        hint = "" if lowest == 0 else (
            " (--allow-empty lets a TAG mode drain every rollout worker: trainers generate)"
            if state.get("tag") else f" (run.mode={state.get('mode')} generates only on rollout workers)")
        raise ScaleError(f"{req} would leave {after} {req.role} worker(s)"
                         f"{' after the queued requests' if queued else ''}; the minimum is {lowest}{hint}")
    return now, after


def write_request(run_dir: Path, req: ScaleRequest) -> Path:
    """Queue `req` for the driver (atomic: tmp name, then os.replace to *.json)."""
    d = Path(run_dir) / REQUESTS
    d.mkdir(exist_ok=True)
    path = d / f"{time.time_ns():020d}-{os.getpid()}.json"
    _write_atomic(path, json.dumps(asdict(req)))
    return path


def take(run_dir: Path) -> list[tuple[str, Optional[ScaleRequest], str]]:
    """Consume every queued request once: (id, request or None, error). A file that does
    not parse is consumed too and answered with the error."""
    out = []
    d = Path(run_dir) / REQUESTS
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            text = p.read_text()
            p.unlink()
        except FileNotFoundError:
            continue
        try:
            req = ScaleRequest(**json.loads(text))
            if req.role not in ROLES or req.op not in "+-=" or not isinstance(req.n, int) or req.n < 0:
                raise ValueError(f"not a valid request: {text.strip()}")
            out.append((p.stem, req, ""))
        except (ValueError, TypeError) as e:
            out.append((p.stem, None, str(e)))
    return out


def answer(run_dir: Path, record: dict) -> None:
    """One JSON line in DIR/scale.log."""
    with open(Path(run_dir) / LOG, "a") as f:
        f.write(json.dumps({"time": time.time(), **record}) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

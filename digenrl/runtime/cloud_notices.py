"""The clouds' own reclaim notices: one watcher per node polls its metadata service and writes
the answer as the notice of every spot worker on that node (`runtime.rollout.watch`).

    the registry   NOTICES/.nodes/<node id>/<worker id>: each spot rollout worker's process writes
                   its entry when it starts (`register`, JSON {"worker", "node_id", "node_ip"}); the
                   driver clears the registry when a run starts and drops the entries of workers
                   that left (`Watchers.poll`). FileNotices skips dot-names, so it reads no entry
                   as a notice
    sources        one per cloud; `poll()` -> None (no notice yet) or the notice file's text:
      AwsSpot      IMDSv2: PUT /latest/api/token (the session token, renewed before its TTL),
                   then GET /latest/meta-data/spot/instance-action with it: 404 none yet, 200
                   {"action": "terminate", "time": ...}, written as it is (parse_notice reads "time")
      GceSpot      GET /computeMetadata/v1/instance/preempted with Metadata-Flavor: Google:
                   "FALSE" none yet, "TRUE" the notice (notice_s: GCE gives 30 s); after the first
                   answer each GET waits for a change (wait_for_change, last_etag, timeout_sec)
      AzureEvents  GET /metadata/scheduledevents (Metadata: true): a Preempt event naming this VM
                   (compute/name) is the notice, its NotBefore the deadline; once every worker
                   of the node has left, the watcher acknowledges it (POST StartRequests with its
                   EventId), so the VM goes without waiting out NotBefore
    NodeWatcher    one node's loop: poll every `poll_s`; on a notice, write it for every worker
                   registered on the node, then for any that register later; a service that
                   does not answer is retried, with one warning per outage
    Watchers       the driver's side: a NodeWatcher actor (no CPU, pinned to its node) for each
                   node that holds a registered worker; `notify_node` is the same for a hook
                   (`python -m digenrl.runtime.cloud_notices --notices DIR --node-ip IP`: a
                   Kubernetes preStop hook)

An answer that is not the cloud's "not yet" and does not parse is a notice all the same: the
watcher warns and writes it as it came, and FileNotices gives it `notice_s`, as for any file
that does not parse. The base URL (`runtime.rollout.metadata_url`) may hold "{node_id}" or
"{node_ip}": the tests' fake metadata servers tell the nodes of one machine apart by them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from datetime import timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Callable, Optional, Union

from digenrl.runtime.preempt import parse_notice, write_notice

log = logging.getLogger(__name__)

REGISTRY = ".nodes"
BASE_URLS = {"aws": "http://169.254.169.254", "gce": "http://metadata.google.internal",
             "azure": "http://169.254.169.254"}
TIMEOUT_S = 2.0  # one metadata request (GCE's hanging GET: timeout_sec + this)
AWS_TOKEN_TTL_S = 21600
AZURE_API = "2020-07-01"


class Unreachable(OSError):
    """The metadata service did not answer (refused, timed out, a 5xx)."""


def _http(method: str, url: str, headers: dict, body: Optional[bytes] = None,
          timeout_s: float = TIMEOUT_S) -> tuple[int, str, dict]:
    """(status, body text, headers) of one request; 4xx is an answer, no answer raises Unreachable."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode(errors="replace"), dict(resp.headers)
    except urllib.error.HTTPError as e:
        if e.code >= 500:
            raise Unreachable(f"{method} {url}: HTTP {e.code}") from None
        return e.code, e.read().decode(errors="replace"), dict(e.headers or {})
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{method} {url}: {getattr(e, 'reason', e)}") from None


class AwsSpot:
    """EC2's spot interruption notice through IMDSv2 (a session token first, then the action)."""

    def __init__(self, base_url: str, clock: Callable[[], float] = time.monotonic):
        self.base, self.clock = base_url.rstrip("/"), clock
        self._token, self._token_until = None, 0.0

    def _session(self, renew: bool = False) -> str:
        if renew or self._token is None or self.clock() >= self._token_until:
            status, text, _ = _http("PUT", f"{self.base}/latest/api/token",
                                    {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)})
            if status != 200 or not text.strip():
                raise Unreachable(f"PUT {self.base}/latest/api/token: HTTP {status} (IMDSv2 gave no session token)")
            self._token, self._token_until = text.strip(), self.clock() + AWS_TOKEN_TTL_S / 2
        return self._token

    def poll(self) -> Optional[str]:
        url = f"{self.base}/latest/meta-data/spot/instance-action"
        for renew in (False, True):  # a 401: the session token expired early; one new one
            status, text, _ = _http("GET", url, {"X-aws-ec2-metadata-token": self._session(renew)})
            if status != 401:
                break
        if status == 404:
            return None  # no interruption scheduled
        if status == 200:
            return text
        raise Unreachable(f"GET {url}: HTTP {status}")


class GceSpot:
    """GCE's preempted flag: "FALSE" until the instance is preempted, then "TRUE"."""

    def __init__(self, base_url: str, wait_s: float):
        self.base, self.wait_s = base_url.rstrip("/"), wait_s
        self.etag: Optional[str] = None

    def poll(self) -> Optional[str]:
        url = f"{self.base}/computeMetadata/v1/instance/preempted"
        timeout = TIMEOUT_S
        if self.etag is not None:  # hang until the value changes, or timeout_sec passes
            wait = max(1, round(self.wait_s))
            url += f"?wait_for_change=true&last_etag={self.etag}&timeout_sec={wait}"
            timeout = wait + TIMEOUT_S
        status, text, headers = _http("GET", url, {"Metadata-Flavor": "Google"}, timeout_s=timeout)
        if status != 200:
            raise Unreachable(f"GET {url}: HTTP {status}")
        self.etag = headers.get("ETag") or headers.get("Etag") or self.etag
        return None if text.strip() == "FALSE" else text


class AzureEvents:
    """Azure's Scheduled Events: a Preempt event for this VM; acknowledged once its node drained."""

    def __init__(self, base_url: str):
        self.base = base_url.rstrip("/")
        self.url = f"{self.base}/metadata/scheduledevents?api-version={AZURE_API}"
        self.vm: Optional[str] = None
        self.event_id: Optional[str] = None  # the Preempt event acted on
        self.acknowledged = False

    def _vm_name(self) -> Optional[str]:
        if self.vm is None:
            status, text, _ = _http("GET", f"{self.base}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
                                    {"Metadata": "true"})
            if status == 200 and text.strip():
                self.vm = text.strip()
        return self.vm

    def poll(self) -> Optional[str]:
        status, text, _ = _http("GET", self.url, {"Metadata": "true"})
        if status != 200:
            raise Unreachable(f"GET {self.url}: HTTP {status}")
        try:
            events = json.loads(text)["Events"]
            vm = self._vm_name()
            preempt = [e for e in events if e["EventType"] == "Preempt"
                       and (vm is None or not e.get("Resources") or vm in e["Resources"])]
        except (ValueError, KeyError, TypeError):
            return text  # not the document Azure sends: a notice all the same (module doc)
        if not preempt:
            return None
        event = preempt[0]
        self.event_id = event.get("EventId")
        notice = {"cloud": "azure", "event": self.event_id}
        try:
            notice["time"] = parsedate_to_datetime(event["NotBefore"]).astimezone(timezone.utc).isoformat()
        except (KeyError, TypeError, ValueError, IndexError):
            pass  # no NotBefore: the deadline is notice_s
        return json.dumps(notice)

    def acknowledge(self) -> None:
        """Tell Azure it may go ahead with the event now (its node's workers have left)."""
        if self.event_id is None or self.acknowledged:
            return
        body = json.dumps({"StartRequests": [{"EventId": self.event_id}]}).encode()
        status, text, _ = _http("POST", self.url, {"Metadata": "true", "Content-Type": "application/json"}, body)
        if status == 200:
            self.acknowledged = True
        else:
            log.warning("Azure Scheduled Events: acknowledging %s got HTTP %s: %s", self.event_id, status, text[:200])


def source(cloud: str, base_url: Optional[str], poll_s: float):
    base = base_url or BASE_URLS[cloud]
    if cloud == "aws":
        return AwsSpot(base)
    if cloud == "gce":
        return GceSpot(base, poll_s)
    if cloud == "azure":
        return AzureEvents(base)
    raise ValueError(f"runtime.rollout.watch: no watcher for cloud {cloud!r}; one of aws, gce, azure")


# -- the registry: which spot workers run on which node ------------------------------------

def register(notices: Union[str, Path], node_id: str, worker_id: str, node_ip: str = "") -> Path:
    """Record that `worker_id` runs on `node_id` (a spot worker's process, when it starts)."""
    path = Path(notices) / REGISTRY / node_id / worker_id
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{worker_id}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"worker": worker_id, "node_id": node_id, "node_ip": node_ip}))
    os.replace(tmp, path)
    return path


def registered(notices: Union[str, Path], node_id: Optional[str] = None, node_ip: Optional[str] = None) -> list[str]:
    """The workers registered on node `node_id` (or on every node whose address is `node_ip`)."""
    root = Path(notices) / REGISTRY
    dirs = [root / node_id] if node_id else (sorted(root.iterdir()) if root.is_dir() else [])
    out = []
    for d in dirs:
        try:
            names = sorted(n for n in os.listdir(d) if not n.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if node_ip is not None:
                try:
                    if json.loads((d / name).read_text()).get("node_ip") != node_ip:
                        continue
                except (OSError, ValueError):
                    continue
            out.append(name)
    return out


def deregister(notices: Union[str, Path], worker_id: str) -> None:
    """Drop `worker_id`'s entries (it left the pools)."""
    root = Path(notices) / REGISTRY
    for entry in root.glob(f"*/{worker_id}"):
        entry.unlink(missing_ok=True)


def clear(notices: Union[str, Path]) -> None:
    """A new run: an earlier run's entries (their worker ids come back) are not this run's."""
    import shutil

    shutil.rmtree(Path(notices) / REGISTRY, ignore_errors=True)


def notify_node(notices: Union[str, Path], text: str, node_id: Optional[str] = None,
                node_ip: Optional[str] = None, skip: frozenset = frozenset(), since: float = 0.0) -> list[str]:
    """Write `text` as the notice of every worker registered on the node (by id or address),
    except those in `skip`; returns the workers written for. A notice written since `since`
    (unix seconds: by SIGTERM, another watcher, in this run) holds; an older file (an earlier
    run's, whose worker ids come back on --resume) is written over."""
    written = []
    for wid in registered(notices, node_id, node_ip):
        if wid in skip:
            continue
        path = Path(notices) / wid
        try:
            fresh = path.stat().st_mtime >= since
        except FileNotFoundError:
            fresh = False
        if not fresh:
            tmp = Path(notices) / f".{wid}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
        written.append(wid)
    return written


# -- one node's watcher ---------------------------------------------------------------------

class NodeWatcher:
    """Polls `src` every `poll_s` and turns its notice into notices for every worker registered
    on `node_id` (module doc). `check()` is one round (tests call it); `run(stop)` loops."""

    def __init__(self, src, notices: Union[str, Path], node_id: str, poll_s: float, notice_s: float,
                 now_unix: Callable[[], float] = time.time):
        self.src, self.notices, self.node_id = src, Path(notices), node_id
        self.poll_s, self.notice_s, self.now_unix = poll_s, notice_s, now_unix
        self.since = now_unix()  # notice files older than the watcher are an earlier run's
        self.notice: Optional[str] = None  # the answer that was a notice
        self.noticed: set[str] = set()  # workers written for
        self.down: Optional[str] = None  # the service's last failure, while it lasts
        self.warnings: list[str] = []

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning(message)

    def check(self) -> Optional[str]:
        """One round: poll (until a notice came), write notices for registered workers not yet
        noticed, acknowledge a drained Azure event. Returns the notice's text, or None."""
        if self.notice is None:
            try:
                answer = self.src.poll()
            except Unreachable as e:
                if self.down is None:
                    self._warn(f"node {self.node_id}: the metadata service does not answer ({e}); "
                               "still polling, and no notice until it does")
                self.down = str(e)
                return None
            if self.down is not None:
                log.warning("node %s: the metadata service answers again", self.node_id)
                self.down = None
            if answer is None:
                return None
            try:
                parse_notice(answer, self.notice_s, self.now_unix())
            except ValueError as e:
                self._warn(f"node {self.node_id}: the metadata service's notice does not parse ({e}); draining "
                           f"the node all the same, deadline notice_s ({self.notice_s:g} s)")
            self.notice = answer
        written = notify_node(self.notices, self.notice, node_id=self.node_id, skip=frozenset(self.noticed),
                              since=self.since)
        new = [w for w in written if w not in self.noticed]
        if new:
            log.warning("node %s: reclaim notice from the metadata service for %s", self.node_id, ", ".join(new))
        self.noticed.update(written)
        if hasattr(self.src, "acknowledge") and not registered(self.notices, self.node_id):
            try:
                self.src.acknowledge()  # every worker of the node has left
            except Unreachable as e:
                log.warning("node %s: acknowledging the event: %s", self.node_id, e)
        return self.notice

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a watcher must outlive one bad round
                log.exception("node %s: metadata watcher round failed", self.node_id)
            # GCE's GET waited for a change already (once it has an ETag); the others wait poll_s
            hung = isinstance(self.src, GceSpot) and self.src.etag is not None and self.notice is None
            if not hung or self.down is not None:
                stop.wait(max(0.0, self.poll_s - (time.monotonic() - started)))


class WatcherActor:
    """A NodeWatcher in a Ray actor pinned to its node (its thread polls; `stop()` ends it)."""

    def __init__(self, cloud: str, base_url: Optional[str], notices: str, poll_s: float, notice_s: float):
        import ray

        ctx = ray.get_runtime_context()
        self.node_id, node_ip = ctx.get_node_id(), ray.util.get_node_ip_address()
        url = (base_url or BASE_URLS[cloud]).replace("{node_id}", self.node_id).replace("{node_ip}", node_ip)
        self.watcher = NodeWatcher(source(cloud, url, poll_s), notices, self.node_id, poll_s, notice_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.watcher.run, args=(self._stop,), daemon=True,
                                        name=f"{cloud}-watcher")
        self._thread.start()

    def state(self) -> dict:
        w = self.watcher
        return {"node_id": self.node_id, "notice": w.notice, "noticed": sorted(w.noticed), "down": w.down,
                "warnings": list(w.warnings)}

    def stop(self) -> None:
        self._stop.set()


class Watchers:
    """The driver's side: a WatcherActor on each node that holds a registered spot worker, started
    when its first worker registers; entries of workers that left the pools are dropped. `poll`
    is an EventLoop poll (at most every `every_s`); `close()` stops the actors."""

    def __init__(self, cloud: str, base_url: Optional[str], notices: Union[str, Path], poll_s: float,
                 notice_s: float, every_s: float = 1.0):
        self.cloud, self.base_url, self.notices = cloud, base_url, Path(notices)
        self.poll_s, self.notice_s, self.every_s = poll_s, notice_s, every_s
        self.actors: dict[str, object] = {}  # node id -> its WatcherActor
        self.watched: list[str] = []  # every node a watcher was started on, by poll (by node id within one)
        self.seen: set[str] = set()  # workers that were in the pools
        self._next = 0.0

    @classmethod
    def from_config(cls, cfg) -> Optional["Watchers"]:
        from digenrl.runtime.preempt import notice_dir

        pool = cfg.runtime.rollout
        if not (pool.preemptible and pool.watch):
            return None
        return cls(pool.watch, pool.metadata_url, notice_dir(cfg), pool.watch_poll_s, pool.notice_s)

    def poll(self, loop) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        present = {w.id for w in loop.sched.workers}
        for wid in self.seen - present:  # left (drained, killed, lost): its node's entry goes
            deregister(self.notices, wid)
        self.seen = (self.seen & present) | {w for w in registered(self.notices) if w in present}
        root = self.notices / REGISTRY
        nodes = sorted(d.name for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
        for node in nodes:
            if node not in self.actors and registered(self.notices, node):
                self.actors[node] = self._start(node)
                self.watched.append(node)

    def _start(self, node_id: str):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        log.info("starting a %s metadata watcher on node %s", self.cloud, node_id)
        actor = ray.remote(WatcherActor).options(
            num_cpus=0, max_restarts=0, name=None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        return actor.remote(self.cloud, self.base_url, str(self.notices), self.poll_s, self.notice_s)

    def close(self) -> None:
        import ray

        for actor in self.actors.values():
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - its node may be gone
                pass
        self.actors.clear()


def _registered_since(notices: Union[str, Path]) -> float:
    """When this run's registry began (the driver clears it as a run starts): its oldest entry."""
    times = [p.stat().st_mtime for p in (Path(notices) / REGISTRY).glob("*/*")]
    return min(times, default=0.0)


def main(argv: Optional[list[str]] = None) -> int:
    """`python -m digenrl.runtime.cloud_notices --notices DIR --node-ip IP [--text T]`: write a
    notice for every spot worker registered on the node at IP (a Kubernetes preStop hook)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--notices", required=True, help="the run's notices directory (runtime.rollout.notices)")
    ap.add_argument("--node-ip", required=True, help="the node's address, as Ray knows it (a pod's IP)")
    ap.add_argument("--node-id", help="the Ray node id instead (several nodes on one address)")
    ap.add_argument("--text", default="", help="the notice's content: '' (notice_s), seconds, or JSON")
    args = ap.parse_args(argv)
    # a notice file from before this node's Ray started is an earlier run's: written over
    written = notify_node(args.notices, args.text, node_id=args.node_id,
                          node_ip=None if args.node_id else args.node_ip, since=_registered_since(args.notices))
    print(f"notices written for {', '.join(written) or 'no worker (none registered on this node)'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

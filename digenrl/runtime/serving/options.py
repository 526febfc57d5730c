"""`ServeOptions`: every knob of the reward server, checked at construction. One field per
`digenrl reward-server` option (`--max-batch` is `max_batch`), so the CLI, `RewardServer`
and the deployment share one typed config.
"""

from __future__ import annotations

from dataclasses import dataclass


INGRESS = ("replica", "proxy")  # who listens for HTTP: each replica itself, or Serve's proxy


@dataclass(frozen=True)
class ServeOptions:
    """How the reward server listens, batches, limits and places its replicas.

    host, port          where the server listens (port 0: a free port; under ingress "proxy", the
                        port of the Serve instance already running on the cluster)
    ingress             "replica": each replica listens on host:port itself (SO_REUSEPORT: the
                        kernel spreads connections over the replicas of one node) and Serve runs no
                        HTTP proxy. "proxy": Serve's HTTP proxy takes every request and hands it to a
                        replica (a Ray call there, the body fetched back from the proxy in another),
                        which balances over nodes but costs 5-8x the CPU per request (docs/runtime.md,
                        "Reward serving speed"). "replica" serves each node's replicas at that node's
                        host:port; clients on other nodes must name a node that has replicas
    replicas            deployment replicas; Serve spreads requests over them
    max_batch           samples per reward call; also the most samples one `@serve.batch` batch
                        holds (a larger request is split into chunks that batch separately)
    batch_wait_s        how long a batch waits for more requests after its first one
    max_request_mb      request bodies over this get a 413
    timeout_s           a request not scored within this gets a 504
    read_timeout_s      a body not received within this gets a 408 (a stalled client)
    max_ongoing         requests one replica holds at once: uploading, queued for a batch, or scored
    max_queued          requests held beyond that before a 503 (-1: no limit): under "proxy", by the
                        proxy while every replica is full; under "replica", each replica's listener
                        answers 503 (JSON "overloaded") past max_ongoing + max_queued requests
    cpus_per_replica, gpus_per_replica   Ray resources each replica reserves
    shutdown_grace_s    on stop (Ctrl-C), how long requests in flight may still run; then their
                        replicas are killed and their clients see an error (RemoteReward retries it)
    """

    host: str = "127.0.0.1"
    port: int = 8000
    ingress: str = "replica"
    replicas: int = 1
    max_batch: int = 64
    batch_wait_s: float = 0.01
    max_request_mb: float = 256.0
    timeout_s: float = 120.0
    read_timeout_s: float = 60.0
    max_ongoing: int = 128  # >= max_batch single-sample requests, so a full batch can form
    max_queued: int = 256
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    shutdown_grace_s: float = 3.0  # with ~4 s of teardown, `digenrl reward-server` exits within 10 s of Ctrl-C

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"reward server option {key} must be {allowed}, got {getattr(self, key)!r}")

        need(0 <= self.port <= 65535, "port", "in 0..65535")
        need(self.ingress in INGRESS, "ingress", f"one of {', '.join(INGRESS)}")
        for key in ("replicas", "max_batch", "max_ongoing"):
            need(isinstance(getattr(self, key), int) and getattr(self, key) >= 1, key, "an integer >= 1")
        need(isinstance(self.max_queued, int) and (self.max_queued >= 1 or self.max_queued == -1),
             "max_queued", "an integer >= 1, or -1 for no limit")
        for key in ("max_request_mb", "timeout_s", "read_timeout_s"):
            need(getattr(self, key) > 0, key, "> 0")
        for key in ("batch_wait_s", "cpus_per_replica", "gpus_per_replica", "shutdown_grace_s"):
            need(getattr(self, key) >= 0, key, ">= 0")

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

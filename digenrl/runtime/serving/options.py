"""`ServeOptions`: every knob of the reward server, checked at construction. One field per
`digenrl reward-server` option (`--max-batch` is `max_batch`), so the CLI, `RewardServer`
and the deployment share one typed config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


INGRESS = ("replica", "proxy")  # who listens for HTTP: each replica itself, or Serve's proxy
REWARD_ON = ("auto", "loop", "thread")  # where a replica runs the reward: its event loop, or a thread of its own
AUTO_REPLICAS_MAX = 4  # replicas=0: one per CPU of this machine, at most this many


@dataclass(frozen=True)
class ServeOptions:
    """How the reward server listens, batches, limits and places its replicas.

    host, port          where the server listens (port 0: a free port; under ingress "proxy", the
                        port of the Serve instance already running on the cluster)
    ingress             "replica": each replica listens on host:port itself (SO_REUSEPORT: the
                        kernel spreads connections over the replicas of one node) and Serve runs no
                        HTTP proxy. "proxy": Serve's HTTP proxy takes every request and hands it to a
                        replica (a Ray call there, the body fetched back from the proxy in another),
                        which balances over nodes but costs 5-8x the CPU per request (docs/measurements/reward-server.md,
                        "Serve's proxy against a listener in each replica"). "replica" serves each node's replicas at that node's
                        host:port; clients on other nodes must name a node that has replicas
    replicas            deployment replicas, each its own process (and its own GIL); 0 ("auto", the
                        default): one per CPU of the machine that starts the server, at most
                        AUTO_REPLICAS_MAX, and no more than the cluster's CPUs (and GPUs) hold at
                        cpus_per_replica (gpus_per_replica) each; at least 1
    reward_on           where a replica calls the reward: "loop" runs each batch on the event loop
                        that reads the requests, "thread" in one thread beside it (the loop keeps reading
                        bodies meanwhile, but the two share the GIL: every GIL-releasing call of one,
                        a socket write, a torch op, a JPEG encode, waits up to Python's 5 ms switch
                        interval to get it back while the other runs). "auto" (default): "thread" when
                        the replica has GPUs (a model's forward pass releases the GIL), else "loop";
                        docs/measurements/reward-server.md has the measurements
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
    token_file          a file holding the bearer token every request must carry (else the token is
                        $DIGENRL_REWARD_TOKEN, else the file $DIGENRL_REWARD_TOKEN_FILE names; never an
                        option's value: `digenrl.rewards.auth`). Without a token the server listens on
                        loopback addresses only
    tls_cert, tls_key   PEM certificate (chain) and private key files: the listener speaks HTTPS
    """

    host: str = "127.0.0.1"
    port: int = 8000
    ingress: str = "replica"
    replicas: int = 0  # auto
    reward_on: str = "auto"
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
    token_file: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"reward server option {key} must be {allowed}, got {getattr(self, key)!r}")

        need(0 <= self.port <= 65535, "port", "in 0..65535")
        need(self.ingress in INGRESS, "ingress", f"one of {', '.join(INGRESS)}")
        need(self.reward_on in REWARD_ON, "reward_on", f"one of {', '.join(REWARD_ON)}")
        need(isinstance(self.replicas, int) and self.replicas >= 0, "replicas", "an integer >= 1, or 0 for auto")
        for key in ("max_batch", "max_ongoing"):
            need(isinstance(getattr(self, key), int) and getattr(self, key) >= 1, key, "an integer >= 1")
        need(isinstance(self.max_queued, int) and (self.max_queued >= 1 or self.max_queued == -1),
             "max_queued", "an integer >= 1, or -1 for no limit")
        for key in ("max_request_mb", "timeout_s", "read_timeout_s"):
            need(getattr(self, key) > 0, key, "> 0")
        for key in ("batch_wait_s", "cpus_per_replica", "gpus_per_replica", "shutdown_grace_s"):
            need(getattr(self, key) >= 0, key, ">= 0")
        need(bool(self.tls_cert) == bool(self.tls_key), "tls_key" if self.tls_cert else "tls_cert",
             "given with " + ("tls_cert (--tls-cert)" if self.tls_cert else "tls_key (--tls-key)"))

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def reward_in_thread(self) -> bool:
        return self.reward_on == "thread" or (self.reward_on == "auto" and self.gpus_per_replica > 0)

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

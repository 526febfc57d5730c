"""Start and stop the reward deployment (`reward_app.RewardDeployment`) on a Ray cluster.

    RewardServer(reward, address=None, **ServeOptions fields)
      start(): Ray (the cluster at `address` or $RAY_ADDRESS, else a new local one)
               -> resource check (replicas x cpus/gpus per replica fit the cluster, or ValueError)
               -> Serve (ingress "replica": no proxy, port 0 picked here; "proxy": its HTTP proxy on
                  host:port, or the one already running on the cluster)
               -> the app at route "/"; returns once every replica is up (and, under "replica",
                  listening at host:port itself)
      stop():  deletes the app (requests in flight get shutdown_grace_s to finish, then their
               replicas are killed); shuts Serve and Ray down if start() started them
    serve_forever(spec, address, **options): `digenrl reward-server`, until Ctrl-C or SIGTERM; it
               exits within shutdown_grace_s + STOP_MARGIN_S of it, or says which step overran

A new local cluster is started with address="local", never by joining whatever cluster
another process left running on this machine; pass address="auto" to join that one.

Authentication (`digenrl.rewards.auth`): the token is RewardServer's `token`, else the file
ServeOptions.token_file, else $DIGENRL_REWARD_TOKEN, else the file $DIGENRL_REWARD_TOKEN_FILE
names. Without one, start() refuses any host but a loopback one. The replicas get the token's
SHA-256, never the token. ServeOptions.tls_cert / tls_key put HTTPS on the listener (the
replicas', or Serve's proxy when this call starts it).
"""

from __future__ import annotations

import gc
import http.client
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Any, Optional

import ray
from ray import serve

from digenrl.rewards.auth import (NEW_TOKEN, TOKEN_ENV, TOKEN_FILE_ENV, bearer, is_loopback, read_token,
                                  token_digest)
from digenrl.rewards.base import Reward
from digenrl.rewards.specs import resolve_factory
from digenrl.runtime.cluster import cluster_address
from digenrl.runtime.serving.options import AUTO_REPLICAS_MAX, ServeOptions
from digenrl.runtime.serving.reward_app import RewardDeployment

log = logging.getLogger(__name__)

APP_NAME = "digenrl-reward"
# After the grace, Serve kills the replicas still draining; their app is gone from
# serve.status() a poll or two later (DELETE_MARGIN_S). Serve's and the local Ray cluster's
# shutdown then take 1-3 s on 2 loaded cores: past grace + STOP_MARGIN_S, serve_forever gives up.
DELETE_MARGIN_S = 2.0
STOP_MARGIN_S = 6.0


class RewardServer:
    """Serve one reward over HTTP on Ray Serve; `start()`/`stop()` or use it as a context manager.

    `reward` is a spec (`digenrl.rewards.specs.resolve_reward`), built on each replica, or a
    Reward object, pickled to each replica (each replica scores with its own copy).
    Keyword options are `ServeOptions` fields. `token`: the bearer token clients must send (None:
    ServeOptions.token_file, else the environment's, see the module doc). Read `.url` after `start()`.
    """

    def __init__(self, reward: str | Reward, address: Optional[str] = None, app_name: str = APP_NAME,
                 token: Optional[str] = None, **options: Any):
        self.reward_spec, self.address, self.app_name = reward, address, app_name
        self.options = ServeOptions(**options)
        self.host, self.port = self.options.host, self.options.port
        self._token = read_token(self.options.token_file) if token is None else token
        self._token_digest = token_digest(self._token) if self._token else None  # what the replicas get
        self._started_ray = self._started_serve = self._deployed = False
        self.stopping = ""  # the step stop() is in, for a message when it overruns

    @property
    def url(self) -> str:
        return f"{self.options.scheme}://{self.host}:{self.port}"

    @property
    def wants_token(self) -> bool:
        return self._token_digest is not None

    def start(self) -> "RewardServer":
        o = self.options
        _check_exposure(o.host, self.wants_token)
        _check_tls(o)
        if isinstance(self.reward_spec, str):  # an unknown name fails here, not in every replica
            _check_wire(resolve_factory(self.reward_spec.partition("?")[0]), self.reward_spec.partition("?")[0])
        else:
            _check_wire(self.reward_spec, getattr(self.reward_spec, "name", type(self.reward_spec).__name__))
        try:
            self._started_ray = _connect(self.address, o)
            if o.replicas == 0:
                o = self.options = replace(o, replicas=auto_replicas(o, os.cpu_count() or 1, ray.cluster_resources()))
            _check_resources(o)
            self.port = self._start_serve()
            o = self.options = replace(o, port=self.port)  # the replicas' listeners bind the port chosen here
            app = RewardDeployment.options(
                num_replicas=o.replicas,
                max_ongoing_requests=o.max_ongoing,
                max_queued_requests=o.max_queued,
                ray_actor_options={"num_cpus": o.cpus_per_replica, "num_gpus": o.gpus_per_replica},
                # stop() lets requests in flight finish (polling every 0.2 s rather than Serve's
                # 2 s), for at most shutdown_grace_s: then Serve kills the replica
                graceful_shutdown_wait_loop_s=0.2,
                graceful_shutdown_timeout_s=o.shutdown_grace_s,
                max_constructor_retry_count=2,  # a reward that cannot load fails start(), not 20 tries later
                logging_config={"enable_access_log": False},  # a log line per request costs throughput
            ).bind(self.reward_spec, o, self._token_digest)
            self._deployed = True  # from here stop() deletes the app, even one whose replicas failed
            # ingress "replica": no proxy routes to the app, so several servers (apps) share a cluster
            serve.run(app, name=self.app_name, route_prefix="/" if o.ingress == "proxy" else None)
        except Exception as e:
            why = _deployment_message(self.app_name) if self._deployed else ""
            self.stop()
            if why:  # Serve's own error names no cause; its status holds the replica's traceback
                raise RuntimeError(f"the reward server did not start: {why}") from e
            raise
        except BaseException:  # Ctrl-C while starting
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Delete the app (requests in flight get up to shutdown_grace_s to finish); stop Serve
        and Ray if start() started them, even when the deletion failed."""
        try:
            if self._deployed:
                self.stopping = f"deleting the app (requests in flight get up to {self.options.shutdown_grace_s:g} s)"
                self._delete_app()
                self._deployed = False
        finally:
            if self._started_serve:
                self.stopping = "shutting Serve down"
                serve.shutdown()
                self._started_serve = False
            if self._started_ray:
                self.stopping = "shutting the local Ray cluster down"
                ray.shutdown()
                self._started_ray = False
            self.stopping = ""

    def _delete_app(self) -> None:
        """serve.delete, seen through: Serve's blocking delete polls once a second and waits 60 s."""
        serve.delete(self.app_name, _blocking=False)
        limit_s = self.options.shutdown_grace_s + DELETE_MARGIN_S
        deadline = time.monotonic() + limit_s
        while self.app_name in serve.status().applications:
            if time.monotonic() > deadline:
                message = (f"Serve did not delete app {self.app_name!r} within {limit_s:g} s: "
                           f"{_deployment_message(self.app_name) or 'its replicas did not stop'}")
                log.warning(message)  # now: the rest of stop() may still overrun and be cut short
                raise TimeoutError(message)
            time.sleep(0.05)

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def health(self) -> dict[str, Any]:
        """GET /health, answered by one replica (its counters, not the sum over replicas)."""
        if self.options.tls_cert:  # this process asks its own listener: no certificate check
            import ssl

            conn = http.client.HTTPSConnection(self.host, self.port, timeout=30, context=ssl._create_unverified_context())
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", "/health", headers={"Authorization": bearer(self._token)} if self._token else {})
            resp = conn.getresponse()
            payload = json.loads(resp.read())
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"{self.url}/health answered {resp.status}: {payload}")
        return payload

    def _start_serve(self) -> int:
        """Start Serve (ingress "proxy": with its HTTP proxy at host:port) or use the running one.
        Returns the port clients use."""
        running = _running_http_options()
        if self.options.ingress == "replica":  # the replicas listen; Serve needs no proxy
            port = self.options.port or _free_port(self.options.host)
            if running is None:
                serve.start(proxy_location="Disabled")
                self._started_serve = True
            elif running[1] == port:
                raise ValueError(f"Ray Serve's HTTP proxy already listens at port {port} on this cluster; "
                                 "pass another --port (or --port 0) for the reward replicas")
            return port
        if running is not None:
            if running[1] is None:
                raise ValueError("Ray Serve already runs on this cluster without an HTTP proxy; "
                                 "use --ingress replica, or stop that Serve instance")
            host, port = running
            if self.options.tls_cert:
                raise ValueError("Ray Serve already runs on this cluster with its HTTP proxy, whose TLS is set when "
                                 "it starts; use --ingress replica for --tls-cert, or stop that Serve instance")
            if (self.options.port not in (0, port)) or self.options.host != host:
                raise ValueError(
                    f"Ray Serve already runs on this cluster with its HTTP proxy at {host}:{port}; "
                    f"it cannot also listen at {self.options.host}:{self.options.port}. "
                    f"Pass --host {host} --port {port} (or --port 0), or stop that Serve instance"
                )
            return port
        port = self.options.port or _free_port(self.options.host)
        tls = {"ssl_certfile": self.options.tls_cert, "ssl_keyfile": self.options.tls_key} if self.options.tls_cert else {}
        serve.start(http_options={"host": self.options.host, "port": port, **tls})
        self._started_serve = True
        return port


def _check_exposure(host: str, has_token: bool) -> None:
    """Refuse to listen where other machines reach the server without a token."""
    if has_token or is_loopback(host):
        return
    raise ValueError(
        f"--host {host} lets other machines reach the reward server, and it has no token: anyone who reaches "
        f"it could use its GPUs and probe the run's reward. Set one in the environment, "
        f"export {TOKEN_ENV}=$({NEW_TOKEN}), or put it in a file and pass --token-file PATH "
        f"(or set {TOKEN_FILE_ENV}=PATH); give the clients the same token ({TOKEN_ENV} or {TOKEN_FILE_ENV}). "
        "Or listen on 127.0.0.1 only"
    )


def _check_tls(o: ServeOptions) -> None:
    for key, path in (("--tls-cert", o.tls_cert), ("--tls-key", o.tls_key)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{key} {path}: no such file")
    if o.tls_cert:
        import ssl

        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(o.tls_cert, o.tls_key)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--tls-cert {o.tls_cert} / --tls-key {o.tls_key}: not a certificate and its key ({e})") \
                from None


def _connect(address: Optional[str], o: ServeOptions) -> bool:
    """Make sure Ray is up; True when this call started a local cluster (sized for the replicas)."""
    if ray.is_initialized():
        return False
    address = cluster_address(address)  # "local": a new local cluster, sized here
    if address:
        ray.init(address=address, include_dashboard=False)
        return False
    cpus = max(os.cpu_count() or 1, math.ceil(o.replicas * o.cpus_per_replica))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False)
    return True


def auto_replicas(o: ServeOptions, cpus_here: int, cluster: dict[str, float]) -> int:
    """replicas=0: one per CPU of this machine (each replica is a process with its own GIL), at most
    AUTO_REPLICAS_MAX, as many as the cluster's CPUs (and GPUs) hold at the per-replica amounts; >= 1."""
    n = min(cpus_here, AUTO_REPLICAS_MAX)
    for key, per in (("CPU", o.cpus_per_replica), ("GPU", o.gpus_per_replica)):
        if per > 0:
            n = min(n, int(cluster.get(key, 0.0) // per))
    return max(n, 1)


def _check_wire(reward: object, name: str) -> None:
    """Refuse a reward that scores more than the wire carries (images and prompts): the generated
    audio (`wants_audio`, e.g. clap) or each sample's source image (`wants_sources`). Its
    in-process form gets them (AsyncRewarder)."""
    for attr, what in (("wants_audio", "the generated audio"), ("wants_sources", "each sample's source image")):
        if getattr(reward, attr, False):
            raise ValueError(f"{name}: scores {what}, which the reward server's requests do not carry "
                             f"(images and prompts only); score it in the trainer (reward.weights.{name})")


def _check_resources(o: ServeOptions) -> None:
    """Refuse replicas the cluster can never place (Serve would wait for them forever)."""
    total = ray.cluster_resources()
    for key, per, flag in (("CPU", o.cpus_per_replica, "--cpus-per-replica"), ("GPU", o.gpus_per_replica, "--gpus-per-replica")):
        need, have = o.replicas * per, total.get(key, 0.0)
        if need > have:
            raise ValueError(
                f"{o.replicas} replicas x {per:g} {key} ({flag}) need {need:g} {key}s; "
                f"the Ray cluster has {have:g}. Lower --replicas or {flag}, or use a bigger cluster (--address)"
            )


def _deployment_message(app_name: str) -> str:
    """What Serve's status says about the app's deployment (a failed replica's traceback), or ''."""
    try:
        app = serve.status().applications.get(app_name)
        return "\n".join(d.message for d in app.deployments.values() if d.message) if app else ""
    except Exception:  # noqa: BLE001 - only for the error message; Serve may be half down
        return ""


def _running_http_options() -> Optional[tuple[str, Optional[int]]]:
    """(host, port) of the Serve HTTP proxy already running on this cluster ((host, None) when that
    Serve runs no proxy), or None when Serve is not running."""
    # Serve has no public getter for its running HTTP options; its client object holds them.
    from ray.serve.config import ProxyLocation
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    http = client.http_config
    return http.host, None if ProxyLocation._normalize(http.location) == ProxyLocation.Disabled else http.port


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_forever(reward: str | Reward, address: Optional[str] = None, **options: Any) -> None:
    """Start a RewardServer and keep it up until Ctrl-C or SIGTERM (`digenrl reward-server`).

    After either, requests in flight get shutdown_grace_s; the process is gone within
    shutdown_grace_s + STOP_MARGIN_S, or says which step of stop() overran and exits anyway.
    """
    stop_on_signals()  # a signal while starting: start() cleans up
    server = RewardServer(reward, address, **options).start()
    stop_on_signals()  # again: starting a local Ray cluster put Ray's own SIGTERM handler in place of ours
    try:
        h = server.health()
        auth = "every request needs the token" if server.wants_token else "no token: this machine only"
        print(f"serving reward {h['reward']!r} at {server.url} with {server.options.replicas} replica(s) "
              f"(POST /score, GET /health; {auth}); Ctrl-C or SIGTERM stops it", flush=True)
        while True:
            time.sleep(3600)
    except Stop as stop:
        print(f"stopping: requests in flight get up to {server.options.shutdown_grace_s:g} s ({stop})", flush=True)
    finally:
        start = time.monotonic()
        stop_within(server, server.options.shutdown_grace_s + STOP_MARGIN_S)
        print(f"stopped in {time.monotonic() - start:.1f} s", flush=True)
        # The process exits next: without this, Python's last garbage collection walks every
        # object torch, Ray and Serve made (1-4 s measured on 2 loaded cores).
        gc.freeze()


class Stop(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived (a KeyboardInterrupt, so RewardServer.start() cleans up on it too)."""


def stop_on_signals(signals=(signal.SIGINT, signal.SIGTERM)) -> None:
    """The first SIGINT or SIGTERM raises Stop in the main thread; later ones only say it is stopping.

    SIGINT is caught even when this process inherited it ignored: a shell starts `cmd &` that way
    (and nohup keeps it), and Python then installs no KeyboardInterrupt, so `kill -INT` would do
    nothing. SIGTERM (`kill`, systemd, Kubernetes) would otherwise end the process without
    stopping the app.
    """
    def first(signum, frame) -> None:
        for s in signals:
            signal.signal(s, again)
        raise Stop(signal.Signals(signum).name)

    def again(signum, frame) -> None:
        print(f"{signal.Signals(signum).name}: already stopping", file=sys.stderr, flush=True)

    for s in signals:
        signal.signal(s, first)


def stop_within(server: RewardServer, limit_s: float, exit_process=os._exit) -> None:
    """server.stop(), or, past limit_s, a message naming the step it is stuck in and exit(1).

    A local Ray cluster started by this process dies with it (Ray ties its processes' fate to
    the driver's), so exiting without Ray's shutdown leaves nothing behind.
    """
    def overran() -> None:
        print(f"digenrl reward-server: stopping took over {limit_s:g} s, still {server.stopping or 'in stop()'}; "
              "exiting without waiting for it", file=sys.stderr, flush=True)
        exit_process(1)

    watchdog = threading.Timer(limit_s, overran)
    watchdog.daemon = True
    watchdog.start()
    try:
        server.stop()
    finally:
        watchdog.cancel()

"""The reward deployment on Ray Serve: one reward behind POST /score and GET /health.

    client --POST /score (safetensors)--> a replica's RewardDeployment: its own uvicorn listener
                                          (ingress "replica"), or Serve's HTTP proxy and a Ray call ("proxy")
        read the body (<= max_request_mb, within read_timeout_s) -> decode_request
        -> chunks of <= max_batch samples -> score_chunk (@serve.batch: concurrent requests
           join one batch) -> the reward (rewards.batching.score_requests) on the replica's event loop,
           or in one thread beside it (option reward_on)
    client <-- JSON {"reward", "scores": [B floats], "elapsed_s"} -- within timeout_s

The wire format is `digenrl.rewards.wire` (safetensors in, never pickle). Errors are JSON
{"error": kind, "message": text} with 400 (malformed, or the wrong reward), 404, 408 (body not
received within read_timeout_s), 411 (no Content-Length), 413 (body over max_request_mb),
500 (the reward raised), 504 (not scored within timeout_s), 503 (full: under "replica", JSON
{"error": "overloaded"} past max_ongoing + max_queued requests in flight; under "proxy", Serve's own
text body once max_queued_requests wait for a full replica); the client retries 5xx either way.
With a token (ServeOptions.token_file, $DIGENRL_REWARD_TOKEN: `digenrl.rewards.auth`), every
route, /health included, first checks `Authorization: Bearer <token>` in constant time; a missing
or wrong one gets 401 {"error": "unauthorized"} and nothing else, before any body is read.
GET /health -> {"status": "ok", "reward", "uploading", "queued", "busy", "served",
"max_request_bytes", "max_batch", "timeout_s", "replica"}: the numbers of the replica that
answered (uploading: request bodies being received; queued: chunks waiting for a reward call;
busy: a reward call is running).

Batching caveat: `@serve.batch` forms a batch from what arrives within batch_wait_s of its
first request, even while the previous batch is still being scored, so under steady load
batches hold about (arrival rate x batch_wait_s) requests, not everything that queued
during the last reward call. Raise batch_wait_s for rewards whose cost is per call, not per sample.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import uvicorn
from ray import serve
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from digenrl.rewards.auth import authorized
from digenrl.rewards.base import Reward
from digenrl.rewards.batching import Scored, score_requests
from digenrl.rewards.specs import resolve_reward
from digenrl.rewards.wire import RequestError, decode_request
from digenrl.runtime.serving.options import ServeOptions

log = logging.getLogger(__name__)

# Bodies up to this are decoded on the event loop: 4 uint8 64x64 images (48 KiB) take ~60 us, less than
# the hop to a thread and back (and the GIL handoff to and from the reward thread) that it replaces
INLINE_DECODE_BYTES = 2**20
DRAIN_FACTOR = 8  # read and discard oversized bodies up to 8x the limit, so the client sees the 413

UNAUTHORIZED = {"error": "unauthorized"}  # the whole answer to a missing or wrong token: no detail
Chunk = tuple[torch.Tensor, list[str]]  # (n, ...) float32 images in [0, 1], n prompts; n <= max_batch


def _samples(chunks: list[Chunk]) -> int:
    """A batch's size for `@serve.batch`: samples, not requests."""
    return sum(images.shape[0] for images, _ in chunks)


@serve.deployment(name="reward")
class RewardDeployment:
    """One replica: builds the reward from its spec (on the replica, so it loads on the
    replica's device) and answers /score and /health. Options come from `ServeOptions`;
    `token_digest` (SHA-256 of the token, so the token itself is in no deployment's arguments):
    every request must carry that token (None: no token asked)."""

    async def __init__(self, reward: str | Reward, options: ServeOptions, token_digest: bytes | None = None):
        self.reward = resolve_reward(reward)
        self.options = options
        self._token_digest = token_digest
        # reward_on "thread": one thread calls the reward, so rewards need not be thread-safe, and the
        # event loop reads other requests' bodies meanwhile; "loop": the event loop calls it (no GIL
        # handoffs between the two; a CPU reward gains nothing from the thread, see ServeOptions)
        self._scorer = ThreadPoolExecutor(1, thread_name_prefix="reward") if options.reward_in_thread else None
        self.score_chunk.set_max_batch_size(options.max_batch)
        self.score_chunk.set_batch_wait_timeout_s(options.batch_wait_s)
        self._uploading = 0  # requests whose body is being received
        self._waiting = 0  # chunks handed to score_chunk and not yet answered
        self._running = 0  # chunks in the reward call now running
        self.served = 0  # requests answered with scores
        self._admitted = 0  # requests the replica's own listener is handling (ingress "replica")
        # ingress "replica": this replica's own HTTP listener, on the event loop @serve.batch uses
        self._listener = await start_listener(self._asgi, options) if options.ingress == "replica" else None

    async def __del__(self) -> None:
        """Serve calls this when the replica stops (after draining the requests Serve itself routed):
        the listener stops accepting and its requests in flight get up to shutdown_grace_s."""
        if getattr(self, "_listener", None) is not None:
            await stop_listener(self._listener)

    async def _asgi(self, scope: dict, receive, send) -> None:
        """The replica listener's ASGI app: the handler Serve's proxy reaches, behind the replica's
        own admission limit (Serve's max_ongoing / max_queued count only the requests Serve routes)."""
        request = Request(scope, receive)
        if not self._authorized(request):
            response = _unauthorized()
        elif (request.method, request.url.path.rstrip("/")) == ("GET", "/health"):  # answered even when full
            response = JSONResponse(self.health())
        elif self.options.max_queued != -1 and self._admitted >= self.options.max_ongoing + self.options.max_queued:
            message = (f"this replica holds {self._admitted} requests (max_ongoing {self.options.max_ongoing} "
                       f"+ max_queued {self.options.max_queued}); retry later")
            response = JSONResponse({"error": "overloaded", "message": message}, status_code=503,
                                    headers={"Connection": "close"})  # its body may be left unread
        else:
            self._admitted += 1
            try:
                response = await self._handle(request)
            finally:
                self._admitted -= 1
        await response(scope, receive, send)

    def _authorized(self, request: Request) -> bool:
        return self._token_digest is None or authorized(request.headers.get("authorization"), self._token_digest)

    async def __call__(self, request: Request) -> Response:
        """The handler Serve's proxy calls (ingress "proxy")."""
        if not self._authorized(request):
            return _unauthorized()
        return await self._handle(request)

    async def _handle(self, request: Request) -> Response:
        route = (request.method, request.url.path.rstrip("/"))
        try:
            if route == ("GET", "/health"):
                return JSONResponse(self.health())
            if route == ("POST", "/score"):
                return JSONResponse(await self._score(request))
            message = f"no route {request.method} {request.url.path}; use GET /health or POST /score"
            raise RequestError(404, "not_found", message)
        except RequestError as err:
            return JSONResponse({"error": err.kind, "message": err.message}, status_code=err.status)
        except ClientDisconnect:
            return Response(status_code=400)  # the client went away mid-body: nobody reads this
        except Exception as e:  # noqa: BLE001 - a handler bug must not take the replica down
            log.exception("unexpected error in %s %s", request.method, request.url.path)
            return JSONResponse({"error": "internal_error", "message": f"{type(e).__name__}: {e}"}, status_code=500)

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "reward": self.reward.name,
            "uploading": self._uploading,
            "queued": max(self._waiting - self._running, 0),
            "busy": self._running > 0,
            "served": self.served,
            "max_request_bytes": self.options.max_request_bytes,
            "max_batch": self.options.max_batch,
            "timeout_s": self.options.timeout_s,
            "replica": serve.get_replica_context().replica_id.unique_id,
        }

    async def _score(self, request: Request) -> dict[str, Any]:
        self._uploading += 1
        try:
            body = await read_body(request, self.options.max_request_bytes, self.options.read_timeout_s)
        finally:
            self._uploading -= 1
        if len(body) <= INLINE_DECODE_BYTES:
            images, prompts, requested = decode_request(body)
        else:  # CPU work, off the loop
            images, prompts, requested = await asyncio.to_thread(decode_request, body)
        name = self.reward.name
        if requested is not None and requested != name:
            raise RequestError(400, "wrong_reward", f"this server serves reward {name!r}, the request asked for {requested!r}")
        start, n = time.perf_counter(), self.options.max_batch
        chunks = [(images[i : i + n], prompts[i : i + n]) for i in range(0, len(prompts), n)]
        self._waiting += len(chunks)
        try:
            # on timeout the chunks are cancelled: those not yet in a batch are never scored
            results: list[Scored] = await asyncio.wait_for(
                asyncio.gather(*(self.score_chunk(c) for c in chunks)), self.options.timeout_s
            )
        except TimeoutError:
            message = f"reward {name!r} did not score the request within {self.options.timeout_s} s"
            raise RequestError(504, "timeout", message) from None
        finally:
            self._waiting -= len(chunks)
        failed = next((r.error for r in results if r.error is not None), None)
        if failed is not None:
            raise RequestError(500, "reward_failed", failed)
        self.served += 1
        scores = torch.cat([r.scores for r in results])  # (B,)
        return {"reward": name, "scores": scores.tolist(), "elapsed_s": time.perf_counter() - start}

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01, batch_size_fn=_samples)  # sizes reset in __init__
    async def score_chunk(self, chunks: list[Chunk]) -> list[Scored]:
        """Score a batch of chunks (<= max_batch samples in all) on the event loop or in the reward thread."""
        self._running = len(chunks)
        try:
            if self._scorer is None:
                return score_requests(self.reward, chunks, self.options.max_batch)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._scorer, score_requests, self.reward, chunks, self.options.max_batch)
        finally:
            self._running = 0


def _unauthorized() -> Response:
    # the request's body is not read; the connection stays open, so the server reads and drops
    # the rest of it, and the client gets the 401 rather than a reset while it still sends
    return JSONResponse(UNAUTHORIZED, status_code=401, headers={"WWW-Authenticate": "Bearer"})


async def start_listener(app, o: ServeOptions) -> uvicorn.Server:
    """Serve `app` at o.host:o.port from this process's running event loop; returns once listening.

    SO_REUSEPORT lets every replica on a node bind the same port; the kernel spreads new connections
    over them. Requests in flight get up to shutdown_grace_s when the listener stops. With
    o.tls_cert and o.tls_key, the listener speaks HTTPS.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in o.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((o.host, o.port))
    except OSError as e:
        sock.close()
        raise RuntimeError(f"the reward replica could not listen at {o.host}:{o.port}: {e}") from None
    config = uvicorn.Config(
        app, interface="asgi3", lifespan="off", access_log=False, proxy_headers=False, log_config=None, log_level=logging.WARNING,
        timeout_graceful_shutdown=o.shutdown_grace_s,  # type: ignore[arg-type] - asyncio.wait_for takes a float
        ssl_certfile=o.tls_cert, ssl_keyfile=o.tls_key,
    )  # fmt: skip
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # signals belong to the Ray worker, not to uvicorn
    server.task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))  # type: ignore[attr-defined]
    while not server.started:
        if server.task.done():  # type: ignore[attr-defined]
            server.task.result()  # type: ignore[attr-defined] - raises what stopped it
            raise RuntimeError(f"the reward replica's listener at {o.host}:{o.port} stopped while starting")
        await asyncio.sleep(0.01)
    return server


async def stop_listener(server: uvicorn.Server) -> None:
    """Stop accepting, let requests in flight finish for up to timeout_graceful_shutdown, then cancel them."""
    server.should_exit = True
    await server.task  # type: ignore[attr-defined]


async def read_body(request: Request, limit: int, read_timeout_s: float) -> bytes:
    """The request body, checked against its Content-Length and `limit` bytes.

    RequestError: 411 (chunked, or no Content-Length), 400 (bad length, short body),
    413 (over limit; drained up to DRAIN_FACTOR x limit first), 408 (not all there within read_timeout_s).
    """
    if "chunked" in request.headers.get("transfer-encoding", "").lower():
        raise RequestError(411, "length_required", "chunked bodies are not supported; send Content-Length")
    raw = request.headers.get("content-length")
    if raw is None:
        raise RequestError(411, "length_required", "POST /score needs a Content-Length header")
    try:
        length = int(raw)
        if length < 0:
            raise ValueError
    except ValueError:
        raise RequestError(400, "malformed_request", f"bad Content-Length {raw!r}") from None
    deadline = asyncio.get_running_loop().time() + read_timeout_s
    try:
        if length > limit:
            if length <= DRAIN_FACTOR * limit:
                await asyncio.wait_for(_receive(request, keep=False), read_timeout_s)
            raise RequestError(
                413, "request_too_large",
                f"body is {length / 2**20:.2f} MiB, over this server's max_request_mb "
                f"({limit / 2**20:.2f} MiB); send fewer samples per request",
            )  # fmt: skip
        body = await asyncio.wait_for(_receive(request, keep=True), read_timeout_s)
        # A reward batch on the event loop (reward_on "loop") holds the timer: when the loop
        # comes back, the rest of a stalled body may be read before the timer fires. The
        # deadline holds either way: a body complete only after it is a 408.
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError
    except TimeoutError:
        message = f"the body did not arrive within the server's read_timeout_s ({read_timeout_s} s)"
        raise RequestError(408, "request_timeout", message) from None
    if len(body) != length:
        raise RequestError(400, "malformed_request", f"body ended after {len(body)} of {length} bytes")
    return body


async def _receive(request: Request, keep: bool) -> bytes:
    parts = []
    async for part in request.stream():
        if keep:
            parts.append(part)
    return b"".join(parts)

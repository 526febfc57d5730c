"""The reward service over HTTP: one reward model behind POST /score, for rewards too heavy to
sit beside a trainer or whose dependencies conflict with ours. Standard library only (plus
torch and safetensors); no pickle anywhere on the wire.

    client --POST /score (safetensors)--> handler thread --submit--> RewardBatcher --> reward
           <------ JSON {"scores": [...]} -- waits <= timeout_s <-- batches concurrent requests

The body format is `digenrl.rewards.wire`; batching, timeouts and failure isolation are
`digenrl.rewards.batching`; `serve` builds the reward from a spec (`digenrl.rewards.specs`).

Statuses: 200, or a JSON error {"error": kind, "message": text} with 400 (malformed), 404,
411 (no Content-Length), 413 (body over max_request_mb), 500 (the reward raised), 503
(queue full), 504 (not scored within timeout_s). GET /health -> {"status": "ok", "reward",
"queued", "busy", "served", "max_request_bytes", "max_batch", "timeout_s"}.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from digenrl.rewards.base import Reward
from digenrl.rewards.batching import RewardBatcher
from digenrl.rewards.specs import resolve_reward
from digenrl.rewards.wire import RequestError, decode_request

log = logging.getLogger(__name__)


class RewardServer:
    """Serve one reward over HTTP. `start()` runs it in background threads; `serve_forever()` blocks.

    port=0 picks a free port (read `.port` / `.url` after construction). max_batch, timeout_s
    and max_queued configure the RewardBatcher; read_timeout_s bounds a stalled client's upload.
    """

    def __init__(
        self,
        reward: Reward,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch: int = 64,
        max_request_mb: float = 256.0,
        timeout_s: float = 120.0,
        max_queued: int = 256,
        read_timeout_s: float = 60.0,
    ):
        if max_request_mb <= 0:
            raise ValueError(f"max_request_mb must be > 0, got {max_request_mb}")
        self.batcher = RewardBatcher(reward, max_batch, timeout_s, max_queued)
        self.max_request_bytes = int(max_request_mb * 2**20)
        handler = type("Handler", (_Handler,), {"service": self, "timeout": read_timeout_s})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self._http_thread: threading.Thread | None = None

    @property
    def reward(self) -> Reward:
        return self.batcher.reward

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "RewardServer":
        self.batcher.start()
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="reward-http")
        self._http_thread.start()
        return self

    def serve_forever(self) -> None:
        self.batcher.start()
        try:
            self.httpd.serve_forever()
        finally:
            self.batcher.stop()

    def stop(self) -> None:
        """Stop accepting connections, then stop the scorer."""
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._http_thread is not None:
            self._http_thread.join(timeout=5)
        self.batcher.stop()

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "reward": self.reward.name,
            "queued": self.batcher.queued,
            "busy": self.batcher.busy,
            "served": self.batcher.served,
            "max_request_bytes": self.max_request_bytes,
            "max_batch": self.batcher.max_batch,
            "timeout_s": self.batcher.timeout_s,
        }


class _Handler(BaseHTTPRequestHandler):
    service: RewardServer  # set on the subclass RewardServer makes
    protocol_version = "HTTP/1.1"
    DRAIN_FACTOR = 8  # read and discard oversized bodies up to 8x the limit so the client sees the 413

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, err: RequestError) -> None:
        self._send_json(err.status, {"error": err.kind, "message": err.message})

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/") == "/health":
            self._send_json(200, self.service.health())
        else:
            message = f"no route GET {self.path}; use GET /health or POST /score"
            self._send_error(RequestError(404, "not_found", message))

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        try:
            self._send_json(200, self._score_request())
        except RequestError as err:
            self._send_error(err)
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away or stalled; nothing to answer
        except Exception as e:  # noqa: BLE001 - a handler bug must not take the server down
            log.exception("unexpected error in /score")
            self.close_connection = True
            self._send_error(RequestError(500, "internal_error", f"{type(e).__name__}: {e}"))

    def _score_request(self) -> dict[str, Any]:
        if self.path.rstrip("/") != "/score":
            raise RequestError(404, "not_found", f"no route POST {self.path}; use POST /score")
        body = self._read_body()
        images, prompts, requested = decode_request(body)
        name = self.service.reward.name
        if requested is not None and requested != name:
            message = f"this server serves reward {name!r}, the request asked for {requested!r}"
            raise RequestError(400, "wrong_reward", message)
        start = time.perf_counter()
        scores = self.service.batcher.submit(images, prompts)
        return {"reward": name, "scores": scores.tolist(), "elapsed_s": time.perf_counter() - start}

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise RequestError(411, "length_required", "chunked bodies are not supported; send Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True
            raise RequestError(411, "length_required", "POST /score needs a Content-Length header")
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise RequestError(400, "malformed_request", f"bad Content-Length {raw!r}") from None
        limit = self.service.max_request_bytes
        if length > limit:
            self.close_connection = True
            if length <= self.DRAIN_FACTOR * limit:
                remaining = length
                while remaining > 0:
                    got = self.rfile.read(min(remaining, 1 << 20))
                    if not got:
                        break
                    remaining -= len(got)
            raise RequestError(
                413, "request_too_large",
                f"body is {length / 2**20:.2f} MiB, over this server's max_request_mb "
                f"({limit / 2**20:.2f} MiB); send fewer samples per request",
            )  # fmt: skip
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            raise RequestError(400, "malformed_request", f"body ended after {len(body)} of {length} bytes")
        return body


def serve(
    reward_spec: str | Reward,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch: int = 64,
    max_request_mb: float = 256.0,
    timeout_s: float = 120.0,
) -> None:
    """Build the reward named by `reward_spec` (see `resolve_reward`) and serve it until interrupted."""
    reward = resolve_reward(reward_spec)
    server = RewardServer(reward, host, port, max_batch, max_request_mb, timeout_s)
    log.warning("serving reward %r at %s (POST /score, GET /health)", reward.name, server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()

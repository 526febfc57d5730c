"""A reward service: one reward model behind HTTP, for rewards too heavy to sit beside a
trainer or whose dependencies conflict with ours. Standard library only (plus torch and
safetensors); no pickle anywhere on the wire.

    client --POST /score (safetensors)--> handler thread --queue--> scorer thread --> reward
           <------ JSON {"scores": [...]} -- waits <= timeout_s <-- batches concurrent requests

Wire format (version 1)
-----------------------
POST /score, Content-Type: application/octet-stream, Content-Length required. The body is a
safetensors file holding

    tensor   "images": uint8 (B, 3, H, W) or (B, F, 3, H, W), pixel / 255 = value in [0, 1]
                       (float16 / bfloat16 / float32 in [0, 1] are accepted too)
    metadata "prompts": JSON list of B strings
             "reward":  optional; if given it must equal the served reward's name

200 -> {"reward": name, "scores": [B floats], "elapsed_s": t}. Errors are JSON
{"error": kind, "message": text} with 400 (malformed), 404, 411 (no Content-Length),
413 (body over max_request_mb), 500 (the reward raised), 503 (queue full), 504 (not scored
within timeout_s). GET /health -> {"status": "ok", "reward", "queued", "busy", "served",
"max_request_bytes", "max_batch", "timeout_s"}.

Batching: requests whose images share a shape are concatenated up to max_batch samples and
scored in one reward call; a larger request is scored in max_batch chunks. One scorer
thread owns the model, so rewards need not be thread-safe. A timed-out request is answered
504 at once; a reward call already running cannot be interrupted, but requests whose
deadline passed while queued are dropped unscored.
"""

from __future__ import annotations

import importlib
import json
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence
from urllib.parse import parse_qsl

import torch

from digenrl.rewards.base import Reward, check_media

log = logging.getLogger(__name__)

WIRE_DTYPES = {"uint8": torch.uint8, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


class RequestError(Exception):
    """A request the server refuses; carries the HTTP status and a message for the client."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


# ---------------------------------------------------------------------------------------
# Wire codec
# ---------------------------------------------------------------------------------------


def encode_request(
    images: torch.Tensor, prompts: Sequence[str], reward: str | None = None, wire_dtype: str = "uint8"
) -> bytes:
    """float images in [0, 1] + prompts -> safetensors bytes. uint8 quantises to round(255 x)."""
    from safetensors.torch import save

    check_media(images, prompts)
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(f"wire_dtype must be one of {sorted(WIRE_DTYPES)}, got {wire_dtype!r}")
    x = images.detach().float().clamp(0.0, 1.0).cpu()
    x = (x * 255.0).round().to(torch.uint8) if wire_dtype == "uint8" else x.to(WIRE_DTYPES[wire_dtype])
    metadata = {"prompts": json.dumps(list(prompts))}
    if reward is not None:
        metadata["reward"] = reward
    return save({"images": x.contiguous()}, metadata=metadata)


def dequantize(images: torch.Tensor) -> torch.Tensor:
    """What the server feeds the reward for a wire tensor: float32 in [0, 1]."""
    return images.float() / 255.0 if images.dtype == torch.uint8 else images.float()


def decode_request(body: bytes) -> tuple[torch.Tensor, list[str], str | None]:
    """safetensors bytes -> (float32 images in [0, 1], prompts, requested reward name or None).

    Raises RequestError(400) naming what is wrong; never anything else for bad input.
    """
    from safetensors.torch import load

    def bad(message: str) -> RequestError:
        return RequestError(400, "malformed_request", message)

    # The safetensors header: u64 little-endian length, then that many bytes of JSON.
    if len(body) < 8:
        raise bad("body is not a safetensors file (shorter than its 8-byte header length)")
    n = int.from_bytes(body[:8], "little")
    if n > len(body) - 8:
        raise bad(f"body is not a safetensors file (header length {n} exceeds the body)")
    try:
        header = json.loads(body[8 : 8 + n])
        metadata = header.get("__metadata__") or {}
        tensors = load(body)
    except Exception as e:  # noqa: BLE001 - anything the parser says means malformed
        raise bad(f"body is not a valid safetensors file: {e}") from None
    if "images" not in tensors:
        raise bad(f"safetensors body needs a tensor named 'images', got {sorted(tensors)}")
    images = tensors["images"]
    if images.dtype not in WIRE_DTYPES.values():
        raise bad(f"'images' dtype must be one of {sorted(WIRE_DTYPES)}, got {images.dtype}")
    if "prompts" not in metadata:
        raise bad("safetensors metadata needs 'prompts': a JSON list of strings, one per sample")
    try:
        prompts = json.loads(metadata["prompts"])
    except json.JSONDecodeError as e:
        raise bad(f"metadata 'prompts' is not valid JSON: {e}") from None
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        raise bad("metadata 'prompts' must be a JSON list of strings")
    images = dequantize(images)
    try:
        check_media(images, prompts)
    except (TypeError, ValueError) as e:
        raise bad(str(e)) from None
    if images.shape[0] == 0:
        raise bad("request has no samples")
    if not torch.isfinite(images).all() or images.min() < 0 or images.max() > 1:
        raise bad("float 'images' must be finite and in [0, 1]")
    return images, prompts, metadata.get("reward")


# ---------------------------------------------------------------------------------------
# Reward specs: what `digenrl reward-server --reward SPEC` names
# ---------------------------------------------------------------------------------------

ALIASES = {
    "clip-score": "digenrl.rewards.clip_models:ClipScore",
    "pickscore": "digenrl.rewards.clip_models:PickScore",
    "aesthetic": "digenrl.rewards.clip_models:AestheticScore",
    "hpsv2": "digenrl.rewards.clip_models:HPSv2Score",
    "ocr": "digenrl.rewards.clip_models:OCRScore",
}


def resolve_reward(spec: str | Reward) -> Reward:
    """A Reward from a spec: `NAME` or `module.path:Factory`, with `?key=value&key=value` kwargs.

    NAME is one of ALIASES; values are parsed as JSON when they parse (numbers, true, null),
    else kept as strings. Example: `pickscore?path=/models/PickScore_v1&processor_path=/models/clip-h&device=cuda`.
    A Reward instance passes through.
    """
    if not isinstance(spec, str):
        reward = spec
    else:
        target, _, query = spec.partition("?")
        target = ALIASES.get(target, target)
        if ":" not in target:
            raise ValueError(f"unknown reward {target!r}: use one of {sorted(ALIASES)} or 'module.path:Factory'")
        module, attr = target.split(":", 1)
        factory = getattr(importlib.import_module(module), attr)
        kwargs = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            try:
                kwargs[key] = json.loads(value)
            except json.JSONDecodeError:
                kwargs[key] = value
        reward = factory(**kwargs)
    if not callable(reward) or not isinstance(getattr(reward, "name", None), str):
        raise TypeError(f"{spec!r} did not give a Reward (a callable with a str `name`)")
    return reward


# ---------------------------------------------------------------------------------------
# The service: a scorer thread that batches queued jobs
# ---------------------------------------------------------------------------------------


@dataclass
class _Job:
    images: torch.Tensor  # (B, ...) float32 in [0, 1]
    prompts: list[str]
    deadline: float  # time.monotonic()
    done: threading.Event = field(default_factory=threading.Event)
    scores: torch.Tensor | None = None
    error: str | None = None
    abandoned: bool = False  # its handler already answered 504


class RewardServer:
    """Serve one reward over HTTP. `start()` runs it in background threads; `serve_forever()` blocks.

    port=0 picks a free port (read `.port` / `.url` after construction).
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
        if max_batch < 1 or max_request_mb <= 0 or timeout_s <= 0:
            raise ValueError("max_batch must be >= 1, max_request_mb and timeout_s > 0")
        self.reward, self.max_batch, self.timeout_s, self.max_queued = reward, max_batch, timeout_s, max_queued
        self.max_request_bytes = int(max_request_mb * 2**20)
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._pending: deque[_Job] = deque()  # taken off the queue by the scorer, not yet scored
        self._stop = threading.Event()
        self._busy = False
        self.served = 0
        self._threads: list[threading.Thread] = []
        handler = type("Handler", (_Handler,), {"service": self, "timeout": read_timeout_s})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "RewardServer":
        for target in (self._score_loop, self.httpd.serve_forever):
            t = threading.Thread(target=target, daemon=True, name=f"reward-server-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def serve_forever(self) -> None:
        scorer = threading.Thread(target=self._score_loop, daemon=True, name="reward-server-scorer")
        scorer.start()
        try:
            self.httpd.serve_forever()
        finally:
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> "RewardServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "reward": self.reward.name,
            "queued": self.queued,
            "busy": self._busy,
            "served": self.served,
            "max_request_bytes": self.max_request_bytes,
            "max_batch": self.max_batch,
            "timeout_s": self.timeout_s,
        }

    @property
    def queued(self) -> int:
        """Requests waiting to be scored (not counting the batch being scored)."""
        return self._queue.qsize() + len(self._pending)

    def submit(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """Queue a request and wait for its scores; RequestError(503/504/500) when it cannot be scored."""
        if self.queued >= self.max_queued:
            raise RequestError(503, "busy", f"{self.queued} requests already queued; retry later")
        job = _Job(images, prompts, deadline=time.monotonic() + self.timeout_s)
        self._queue.put(job)
        if not job.done.wait(self.timeout_s):
            job.abandoned = True
            message = f"reward {self.reward.name!r} did not score the request within {self.timeout_s} s"
            raise RequestError(504, "timeout", message)
        if job.error is not None:
            raise RequestError(500, "reward_failed", job.error)
        return job.scores

    def _score_loop(self) -> None:
        pending = self._pending
        while not self._stop.is_set():
            if not pending:
                try:
                    pending.append(self._queue.get(timeout=0.1))
                except queue.Empty:
                    continue
            while True:  # everything that arrived meanwhile may join this batch
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            self._busy = True  # before the pending jobs leave `queued`, so /health never shows idle
            try:
                now = time.monotonic()
                live = [j for j in pending if not j.abandoned and j.deadline > now]
                pending.clear()
                if not live:
                    continue
                # first come first served; same-shaped jobs join it up to max_batch samples
                first, batch, n = live[0], [live[0]], live[0].images.shape[0]
                for job in live[1:]:
                    if job.images.shape[1:] == first.images.shape[1:] and n + job.images.shape[0] <= self.max_batch:
                        batch.append(job)
                        n += job.images.shape[0]
                    else:
                        pending.append(job)
                self._score_batch(batch)
            finally:
                self._busy = False

    def _score_batch(self, batch: list[_Job]) -> None:
        try:
            scores = self._score(torch.cat([j.images for j in batch]), [p for j in batch for p in j.prompts])
        except Exception as e:  # noqa: BLE001 - the reward's failure goes back to the client, not up
            if len(batch) > 1:  # find out which request it was: score them one by one
                for job in batch:
                    self._score_batch([job])
                return
            batch[0].error = f"reward {self.reward.name!r} raised {type(e).__name__}: {e}"
            log.exception("reward failed")
            batch[0].done.set()
            return
        start = 0
        for job in batch:
            job.scores = scores[start : start + job.images.shape[0]]
            start += job.images.shape[0]
            self.served += 1
            job.done.set()

    @torch.no_grad()
    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        outs = []
        for i in range(0, images.shape[0], self.max_batch):
            chunk = images[i : i + self.max_batch]
            out = torch.as_tensor(self.reward(chunk, prompts[i : i + self.max_batch])).float().cpu()
            if out.shape != (chunk.shape[0],):
                raise ValueError(f"returned shape {tuple(out.shape)} for {chunk.shape[0]} samples")
            outs.append(out)
        scores = torch.cat(outs)
        if not torch.isfinite(scores).all():
            raise ValueError("returned non-finite scores")
        return scores


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
        scores = self.service.submit(images, prompts)
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

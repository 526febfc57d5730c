"""`RemoteReward`: the reward protocol over HTTP, talking to `digenrl reward-server`
(`digenrl.runtime.serving`, on Ray Serve; request bodies in the `digenrl.rewards.wire` format).

Retries connection failures and 5xx answers (server overloaded, reward crashed, 504
timeout) with exponential backoff; 4xx answers (our request is wrong) fail at once. Either
way the exception names the server, the reward and the server's own message.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import torch

from digenrl.rewards.base import check_media
from digenrl.rewards.wire import encode_request


class RemoteRewardError(RuntimeError):
    """A remote reward could not score a batch. `status` is the last HTTP status, or None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RemoteReward:
    """A reward served by `digenrl reward-server` at `url`.

    `name` must be the served reward's name (the server checks it, so a client pointed at the
    wrong server fails loudly instead of training on the wrong reward). `retries` is the number
    of further attempts after the first; attempt k waits backoff * 2**k seconds before it.
    `timeout_s` is the client's socket timeout per attempt: keep it above the server's.
    Images travel as uint8 by default (4x smaller than float32; the reward sees round(255 x) / 255).
    Backoff waits go through `sleep` (tests pass one that records them).
    """

    def __init__(
        self,
        url: str,
        name: str,
        timeout_s: float = 300.0,
        retries: int = 3,
        backoff: float = 0.5,
        wire_dtype: str = "uint8",
        sleep: Callable[[float], None] = time.sleep,
    ):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"reward url must look like http://host:port, got {url!r}")
        self.url, self.name = f"{parts.scheme}://{parts.netloc}", name
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self.timeout_s, self.retries, self.backoff, self.wire_dtype = timeout_s, retries, backoff, wire_dtype
        self._sleep = sleep

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout_s)
        try:
            headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError:
            payload = {"error": "bad_response", "message": raw[:200].decode(errors="replace")}
        return resp.status, payload

    def health(self) -> dict[str, Any]:
        """The server's GET /health answer (raises on connection errors, no retries)."""
        status, payload = self._request("GET", "/health")
        if status != 200:
            raise RemoteRewardError(f"{self.url}/health answered {status}: {payload}", status)
        return payload

    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        check_media(images, prompts)
        body = encode_request(images, prompts, reward=self.name, wire_dtype=self.wire_dtype)
        last, status = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff * 2 ** (attempt - 1))
            try:
                status, payload = self._request("POST", "/score", body)
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
                last, status = f"{type(e).__name__}: {e}", None
                continue
            if status == 200:
                scores = torch.tensor(payload["scores"], dtype=torch.float32)
                if scores.shape != (len(prompts),):
                    message = f"{self.url} returned {tuple(scores.shape)} scores for {len(prompts)} samples"
                    raise RemoteRewardError(message, status)
                return scores
            last = f"HTTP {status} {payload.get('error')}: {payload.get('message')}"
            if status < 500:
                raise RemoteRewardError(f"reward {self.name!r} at {self.url} rejected the request: {last}", status)
        raise RemoteRewardError(
            f"reward {self.name!r} at {self.url} failed after {self.retries + 1} attempts; last error: {last}", status
        )

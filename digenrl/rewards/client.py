"""`RemoteReward`: the reward protocol over HTTP, talking to `digenrl reward-server`
(`digenrl.runtime.serving`, on Ray Serve; request bodies in the `digenrl.rewards.wire` format).

Retries connection failures and 5xx answers (server overloaded, reward crashed, 504
timeout) with exponential backoff; 4xx answers (our request is wrong) fail at once. Either
way the exception names the server, the reward and the server's own message.

A server with a token (`digenrl.rewards.auth`) wants `Authorization: Bearer <token>` on every
request: the client takes the token from $DIGENRL_REWARD_TOKEN, else the file
$DIGENRL_REWARD_TOKEN_FILE names (or the `token` argument). A 401 fails at once, naming those
keys. An https server's certificate is checked against the system's CAs, or against the file
$DIGENRL_REWARD_CA names (a private CA, or a self-signed server's own certificate).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import torch

from digenrl.rewards.auth import CA_ENV, TOKEN_ENV, TOKEN_FILE_ENV, bearer, read_token, token_source
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
    `token`: the server's bearer token (None: the environment's, `read_token`; "" sends none).
    `ca_file`: what an https server's certificate is checked against (None: $DIGENRL_REWARD_CA,
    else the system's CAs).
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
        token: str | None = None,
        ca_file: str | None = None,
    ):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"reward url must look like http://host:port, got {url!r}")
        self.url, self.name = f"{parts.scheme}://{parts.netloc}", name
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self.timeout_s, self.retries, self.backoff, self.wire_dtype = timeout_s, retries, backoff, wire_dtype
        self._sleep = sleep
        self._token = read_token() if token is None else token
        self._token_from = token_source() if token is None else "the token given to RemoteReward"
        self._ca_file = ca_file if ca_file is not None else os.environ.get(CA_ENV)
        self._tls = None  # the https context, made at the first request (it does not pickle)

    def __repr__(self) -> str:  # never the token
        return f"RemoteReward({self.url!r}, {self.name!r}, token={'set' if self._token else 'none'})"

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tls": None}

    def _connection(self) -> http.client.HTTPConnection:
        if self._scheme == "http":
            return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=self._ca_file)
        return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout_s, context=self._tls)

    def _unauthorized(self) -> RemoteRewardError:
        if self._token:
            why = (f"it refused the token from {self._token_from}: that is not this server's token "
                   f"(set {TOKEN_ENV}, or {TOKEN_FILE_ENV} to a file holding it, to the server's)")
        else:
            why = (f"it wants a token and none is set: set {TOKEN_ENV} to the server's token, or "
                   f"{TOKEN_FILE_ENV} to a file holding it, where the reward is scored (on every node)")
        return RemoteRewardError(f"reward {self.name!r} at {self.url} answered 401 Unauthorized: {why}", 401)

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
        conn = self._connection()
        try:
            headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
            if self._token:
                headers["Authorization"] = bearer(self._token)
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
        if status == 401:
            raise self._unauthorized()
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
            except ssl.SSLCertVerificationError as e:  # no retry mends it
                raise RemoteRewardError(f"reward {self.name!r} at {self.url}: its certificate does not check out "
                                        f"({e.verify_message}); set {CA_ENV} to the CA (or the server's "
                                        "certificate) that signed it") from None
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
                last, status = f"{type(e).__name__}: {e}", None
                continue
            if status == 200:
                scores = torch.tensor(payload["scores"], dtype=torch.float32)
                if scores.shape != (len(prompts),):
                    message = f"{self.url} returned {tuple(scores.shape)} scores for {len(prompts)} samples"
                    raise RemoteRewardError(message, status)
                return scores
            if status == 401:
                raise self._unauthorized()
            last = f"HTTP {status} {payload.get('error')}: {payload.get('message')}"
            if status < 500:
                raise RemoteRewardError(f"reward {self.name!r} at {self.url} rejected the request: {last}", status)
        raise RemoteRewardError(
            f"reward {self.name!r} at {self.url} failed after {self.retries + 1} attempts; last error: {last}", status
        )

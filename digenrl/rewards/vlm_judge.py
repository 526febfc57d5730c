"""`VLMJudge`: a vision-language model, served behind an OpenAI-compatible chat-completions
endpoint (vLLM, SGLang), asked about each generated image; its answer is the reward.

    reward.paths.vlm-judge="url=http://10.0.0.5:8000&model=Qwen/Qwen2.5-VL-7B-Instruct&style=yes-no"

One request per (image, prompt), concurrently (`max_concurrency`):

    POST {url}/v1/chat/completions
    {"model": M, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}},
        {"type": "text", "text": question.format(prompt=prompt)}]}], ...}

Two styles turn the answer into a number in [0, 1]:

    yes-no   max_tokens=1, logprobs=true, top_logprobs=K. Over the first token's top-K
             alternatives, P(yes) / (P(yes) + P(no)), where "Yes", " yes", "YES"... all count
             as yes. A soft score (VQAScore-style), so two "Yes" images still rank.
    score    the model writes text ending with "<marker> <number>" (UnifiedReward's
             "Final Score: 4"); the last number after the marker, mapped from
             [score_min, score_max] (default 1..5) to [0, 1].

Connection errors, timeouts (`timeout_s` per request) and 5xx answers are retried
(`retries` more attempts, waiting backoff * 2**k); a 4xx answer is our request's fault and
raises at once with the server's message. An answer that parses to no score (not JSON, no
choices, no yes/no token, no number) raises with what came back, or scores 0 with
`on_malformed="zero"`. `GET {url}/v1/models` at construction checks the server is up and
serves `model`. Only the standard library speaks HTTP.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import http.client
import io
import json
import logging
import math
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

import torch

from digenrl.rewards.base import score_media, to_pil_images

log = logging.getLogger(__name__)

STYLES = ("yes-no", "score")
IMAGE_FORMATS = ("png", "jpeg")
ON_MALFORMED = ("error", "zero")
_STYLE_ONLY = {"top_logprobs": "yes-no", "max_tokens": "score", "score_marker": "score",
               "score_min": "score", "score_max": "score"}  # fmt: skip

YES_NO_QUESTION = 'Does this image show "{prompt}"? Answer Yes or No.'
# UnifiedReward's two criteria and answer format, in our words; {lo} {hi} {marker} are
# filled from the config once, leaving a template with {prompt} only.
SCORE_QUESTION = (
    "You are given a text caption and an image generated from it. Judge the image on two criteria:\n"
    "1. Alignment with the caption: are the objects, their counts, attributes and relations as described?\n"
    "2. Image quality: clarity, detail, colour and overall aesthetic appeal.\n"
    "Explain briefly, then end your answer with '{marker} <score>', a score from {lo} (poor) to {hi} (excellent).\n"
    "Caption: {prompt}"
)
QUOTE_CHARS = 300  # how much of a bad answer an error message repeats


class VLMJudgeError(RuntimeError):
    """The judge could not score a batch. `status` is the last HTTP status, or None."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class MalformedAnswerError(VLMJudgeError):
    """The server answered 200, but the answer holds no score."""


@dataclass
class JudgeConfig:
    """What `reward.paths.vlm-judge` may set; invalid values raise ValueError naming the key.

    Keys marked (yes-no) or (score) belong to that style and are refused with the other.
    """

    url: str  # http(s)://host:port of the server (no /v1)
    model: str  # the served model name, as GET /v1/models lists it
    style: str = "yes-no"  # see STYLES
    question: str | None = None  # a template with {prompt}; None = the style's default
    image_format: str = "png"  # how images travel: png (lossless) or jpeg (quality 95, smaller)
    max_concurrency: int = 8  # requests in flight at once
    timeout_s: float = 120.0  # per request attempt
    retries: int = 3  # further attempts after the first, on connection errors, timeouts and 5xx
    backoff: float = 0.5  # attempt k waits backoff * 2**(k-1) seconds
    on_malformed: str = "error"  # error: raise; zero: score 0 and log a warning
    top_logprobs: int | None = None  # (yes-no) alternatives returned for the first token; default 20
    max_tokens: int | None = None  # (score) answer length cap; default 1024
    score_marker: str | None = None  # (score) text before the number; default "Final Score:"
    score_min: float | None = None  # (score) the scale the question asks for; default 1
    score_max: float | None = None  # (score) default 5
    sample_frames: int | None = None  # videos: judge this many evenly spaced frames (None: all)
    api_key_env: str | None = None  # environment variable holding the server's --api-key, if it has one

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "JudgeConfig":
        """Like the constructor, but unknown or missing keys raise a ValueError that lists the keys."""
        keys = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(kwargs) - set(keys))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; vlm-judge takes: {', '.join(keys)}")
        for key in ("url", "model"):
            if kwargs.get(key) in (None, ""):
                raise ValueError(f"{key} is required, e.g. url=http://host:8000&model=Qwen/Qwen2.5-VL-7B-Instruct")
        return cls(**kwargs)

    def __post_init__(self) -> None:
        # spec values arrive JSON-parsed: a model named 7 is the string "7"
        self.url, self.model = str(self.url), str(self.model)
        _allowed(self.style, "style", STYLES)
        _allowed(self.image_format, "image_format", IMAGE_FORMATS)
        _allowed(self.on_malformed, "on_malformed", ON_MALFORMED)
        parts = urlsplit(self.url)
        _require(parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in ("", "/"), "url",
                 f"{self.url!r} is not http(s)://host:port (without /v1)")
        _require(_is_int(self.max_concurrency) and self.max_concurrency >= 1, "max_concurrency",
                 "must be an integer >= 1")
        _require(_is_number(self.timeout_s) and self.timeout_s > 0, "timeout_s", "must be > 0")
        _require(_is_int(self.retries) and self.retries >= 0, "retries", "must be an integer >= 0")
        _require(_is_number(self.backoff) and self.backoff >= 0, "backoff", "must be >= 0")
        _require(self.sample_frames is None or (_is_int(self.sample_frames) and self.sample_frames >= 1),
                 "sample_frames", "must be an integer >= 1, or null for all frames")
        if self.api_key_env is not None:
            _require(isinstance(self.api_key_env, str) and bool(self.api_key_env), "api_key_env",
                     "must name an environment variable")
        for key, style in _STYLE_ONLY.items():
            _require(getattr(self, key) is None or self.style == style, key,
                     f"applies to style={style} only (this judge has style={self.style})")
        if self.style == "yes-no":
            self.top_logprobs = 20 if self.top_logprobs is None else self.top_logprobs
            _require(_is_int(self.top_logprobs) and self.top_logprobs >= 1, "top_logprobs", "must be an integer >= 1")
        else:
            self.max_tokens = 1024 if self.max_tokens is None else self.max_tokens
            self.score_marker = "Final Score:" if self.score_marker is None else str(self.score_marker)
            self.score_min = 1.0 if self.score_min is None else self.score_min
            self.score_max = 5.0 if self.score_max is None else self.score_max
            _require(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1")
            _require(bool(self.score_marker.strip()), "score_marker", "must not be empty")
            _require(_is_number(self.score_min) and _is_number(self.score_max) and self.score_min < self.score_max,
                     "score_min", f"must be a number below score_max, got {self.score_min!r} and {self.score_max!r}")
        if self.question is None:
            self.question = YES_NO_QUESTION if self.style == "yes-no" else (
                SCORE_QUESTION.replace("{marker}", self.score_marker.replace("{", "{{").replace("}", "}}"))
                .replace("{lo}", f"{self.score_min:g}").replace("{hi}", f"{self.score_max:g}"))
        self.question = str(self.question)
        _require("{prompt}" in self.question, "question", "must contain {prompt}, where the prompt goes")
        try:
            self.question.format(prompt="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"question: {e!r} in {self.question!r}; only {{prompt}} is filled, write other "
                             "braces as {{ and }}") from None


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {message}")


def _allowed(value: Any, key: str, allowed: tuple) -> None:
    _require(value in allowed, key, f"{value!r} is not allowed; choose one of: {', '.join(allowed)}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _quote(raw: bytes | str) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return repr(text[:QUOTE_CHARS] + ("..." if len(text) > QUOTE_CHARS else ""))


# ---------------------------------------------------------------------------------------
# Answers -> scores (pure)
# ---------------------------------------------------------------------------------------


def first_choice(raw: bytes) -> dict:
    """choices[0] of a chat-completions answer; MalformedAnswerError quoting the body if absent."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MalformedAnswerError(f"the answer is not JSON: {_quote(raw)}") from None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedAnswerError(f"the answer has no choices: {_quote(raw)}")
    return choices[0]


def yes_probability(choice: dict) -> float:
    """P(yes) / (P(yes) + P(no)) from the first generated token's top logprobs.

    Token variants ("Yes", " yes", "YES") are summed: they are different tokens for the same word.
    """
    try:
        first = choice["logprobs"]["content"][0]
        candidates = list(first.get("top_logprobs") or []) + [first]  # the sampled token too
    except (KeyError, IndexError, TypeError, AttributeError):
        quoted = _quote(json.dumps(choice))
        raise MalformedAnswerError(f"the answer has no logprobs for its first token: {quoted}") from None
    p = {"yes": 0.0, "no": 0.0}
    seen = set()
    for c in candidates:
        token, logprob = (c.get("token"), c.get("logprob")) if isinstance(c, dict) else (None, None)
        if not isinstance(token, str) or not _is_number(logprob) or token in seen:
            continue
        seen.add(token)
        word = token.strip().lower()
        if word in p:
            p[word] += math.exp(logprob)
    if p["yes"] + p["no"] == 0.0:
        tokens = [c.get("token") for c in candidates if isinstance(c, dict)]
        raise MalformedAnswerError(f"no yes/no token among the first token's top logprobs {tokens!r}")
    return p["yes"] / (p["yes"] + p["no"])


def text_score(text: str, marker: str, lo: float, hi: float) -> float:
    """The last number after `marker` (case-insensitive) in `text`, mapped from [lo, hi] to [0, 1]."""
    found = re.findall(re.escape(marker.strip()) + r"\s*\**\s*(-?\d+(?:\.\d+)?)", text, flags=re.IGNORECASE)
    if not found:
        raise MalformedAnswerError(f"no '{marker} <number>' in the answer: {_quote(text)}")
    value = float(found[-1])
    if not lo <= value <= hi:
        raise MalformedAnswerError(f"score {value:g} is outside [{lo:g}, {hi:g}] in the answer: {_quote(text)}")
    return (value - lo) / (hi - lo)


# ---------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------


class VLMJudge:
    """A VLM judge as a reward: (B, 3, H, W) or (B, F, 3, H, W) in [0, 1] + prompts -> (B,) in [0, 1].

    Keyword arguments are `JudgeConfig`'s fields. Construction checks the server
    (GET /v1/models, retried like a request) and raises VLMJudgeError if it is unreachable or
    does not serve `model`. Backoff waits go through `sleep` (tests pass one that records them).
    """

    name = "vlm-judge"

    def __init__(self, url: str, model: str, *, sleep: Callable[[float], None] = time.sleep, **options: Any):
        self.cfg = JudgeConfig.from_kwargs(url=url, model=model, **options)
        self._sleep = sleep
        parts = urlsplit(self.cfg.url)
        self.url = f"{parts.scheme}://{parts.netloc}"
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._headers = {"Content-Type": "application/json"}
        if self.cfg.api_key_env is not None:
            key = os.environ.get(self.cfg.api_key_env)
            if not key:
                raise ValueError(f"api_key_env: the environment variable {self.cfg.api_key_env} is not set")
            self._headers["Authorization"] = f"Bearer {key}"
        self.check()

    # -- HTTP ----------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.cfg.timeout_s)
        try:
            conn.request(method, path, body=body, headers=self._headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        """The body of a 200 answer. Connection errors, timeouts and 5xx are retried; 4xx is not."""
        last, status, unreachable = "", None, False
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                self._sleep(self.cfg.backoff * 2 ** (attempt - 1))
            try:
                status, raw = self._request(method, path, body)
            except TimeoutError:  # socket.timeout: connected, but no answer within timeout_s
                last, status, unreachable = f"no answer within timeout_s={self.cfg.timeout_s:g}", None, False
                continue
            except (OSError, http.client.HTTPException) as e:  # refused, reset, DNS
                last, status, unreachable = f"{type(e).__name__}: {e}", None, _unreachable(e)
                continue
            if status == 200:
                return raw
            last = f"HTTP {status}: {_server_message(raw)}"
            if status < 500:
                raise VLMJudgeError(f"VLM judge at {self.url} rejected {method} {path} (not retried): {last}", status)
        attempts = f"{self.cfg.retries + 1} attempt(s)"
        if unreachable:
            raise VLMJudgeError(f"VLM judge server at {self.url} is not reachable after {attempts} ({last}); "
                                "is it running? (e.g. vllm serve Qwen/Qwen2.5-VL-7B-Instruct --port 8000)")
        raise VLMJudgeError(f"VLM judge at {self.url} failed {method} {path} after {attempts}; last error: {last}",
                            status)

    def check(self) -> list[str]:
        """The served model names (GET /v1/models); raises VLMJudgeError unless `model` is among them."""
        raw = self._call("GET", "/v1/models")
        try:
            served = [m["id"] for m in json.loads(raw)["data"]]
        except (ValueError, KeyError, TypeError):
            raise VLMJudgeError(f"{self.url}/v1/models did not list models: {_quote(raw)}") from None
        if self.cfg.model not in served:
            raise VLMJudgeError(f"VLM judge at {self.url} does not serve model {self.cfg.model!r}; it serves "
                                f"{served}: set model= to one of them")
        return served

    # -- scoring -------------------------------------------------------------------------

    def _encode(self, image) -> str:
        """A PIL image -> data URL."""
        buf = io.BytesIO()
        if self.cfg.image_format == "png":
            image.save(buf, format="PNG")
        else:
            image.save(buf, format="JPEG", quality=95)
        return f"data:image/{self.cfg.image_format};base64,{base64.b64encode(buf.getvalue()).decode()}"

    def request_body(self, image_url: str, prompt: str) -> dict:
        """The chat-completions request for one (image, prompt)."""
        body = {
            "model": self.cfg.model,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": self.cfg.question.format(prompt=prompt)},
            ]}],
            "temperature": 0,
        }  # fmt: skip
        if self.cfg.style == "yes-no":
            body.update(max_tokens=1, logprobs=True, top_logprobs=self.cfg.top_logprobs)
        else:
            body.update(max_tokens=self.cfg.max_tokens)
        return body

    def _judge_one(self, image, prompt: str) -> float:
        body = json.dumps(self.request_body(self._encode(image), prompt)).encode()
        raw = self._call("POST", "/v1/chat/completions", body)
        try:
            choice = first_choice(raw)
            if self.cfg.style == "yes-no":
                return yes_probability(choice)
            text = (choice.get("message") or {}).get("content")
            if not isinstance(text, str):
                raise MalformedAnswerError(f"the answer has no message text: {_quote(raw)}")
            return text_score(text, self.cfg.score_marker, self.cfg.score_min, self.cfg.score_max)
        except MalformedAnswerError as e:
            message = f"VLM judge {self.cfg.model!r} at {self.url}, prompt {prompt!r}: {e}"
            if self.cfg.on_malformed == "zero":
                log.warning("%s (scored 0: on_malformed=zero)", message)
                return 0.0
            raise MalformedAnswerError(message, 200) from None

    def _score_images(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        pils = to_pil_images(images)  # (N, 3, H, W) -> N images; encoded in the worker threads
        if not pils:
            return torch.zeros(0)
        workers = min(self.cfg.max_concurrency, len(pils))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vlm-judge") as pool:
            futures = [pool.submit(self._judge_one, im, p) for im, p in zip(pils, prompts)]
            try:
                scores = [f.result() for f in futures]  # input order, whatever order they finish in
            except BaseException:
                for f in futures:
                    f.cancel()  # queued requests; those in flight end within their timeout
                raise
        return torch.tensor(scores, dtype=torch.float32)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return score_media(self._score_images, images, prompts, self.cfg.sample_frames)


def _unreachable(e: Exception) -> bool:
    """Nothing listens there (refused), or the host cannot be found or routed to."""
    unroutable = (errno.EHOSTUNREACH, errno.ENETUNREACH)
    return isinstance(e, (ConnectionRefusedError, socket.gaierror)) or getattr(e, "errno", None) in unroutable


def _server_message(raw: bytes) -> str:
    """The error text of a non-200 answer: vLLM and SGLang send {"message": ...} or
    {"error": {"message": ...}}; anything else is quoted."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _quote(raw)
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if payload.get("message"):
            return str(payload["message"])
        if isinstance(err, str):
            return err
    return _quote(raw)

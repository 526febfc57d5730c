"""VLMJudge against a real local HTTP server speaking the OpenAI chat-completions API.

The fake server decodes each request's base64 image and answers from its content:
m = mean pixel brightness in [0, 1] (flipped to 1 - m when the question says "dark"), so

    yes-no   top logprobs " Yes": log(0.9 m), "yes": log(0.1 m), "No": log(1 - m)
             -> P(yes) / (P(yes) + P(no)) = m, which needs both yes variants summed
    score    "... Final Score: {1 + 4 m}" -> (1 + 4 m - 1) / 4 = m on the default 1..5 scale

A score equal to m for every sample shows the client sent each sample's own image with its
own prompt. Images are constant, so m = round(255 v) / 255 exactly after the uint8 PNG.

Tests order the fake server's threads with a barrier (requests in flight at once) and a gate
(an answer held until the test has seen the client give up on it), not with sleeps. The one
delay left (`FakeVLM.delay`) only widens the window in which a judge that ignored
max_concurrency=1 would overlap its requests; it cannot make a correct judge fail.
"""

from __future__ import annotations

import base64
import io
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from digenrl.config.errors import ConfigError
from digenrl.config.schema import load_config
from digenrl.rewards import build_reward
from digenrl.rewards.vlm_judge import MalformedAnswerError, VLMJudge, VLMJudgeError, text_score, yes_probability

MODEL = "test-vlm"


class FakeVLM(ThreadingHTTPServer):
    """An OpenAI-compatible VLM server whose answers are functions of the image it receives."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = "ok"  # how POSTs are answered: see _Handler._answer
        self.barrier: threading.Barrier | None = None  # when set, every POST waits there before its answer
        self.hold = "none"  # "first" or "all": those POSTs wait for `gate` (opened at teardown)
        self.gate = threading.Event()
        self.delay = 0.0  # seconds every POST takes (only to give overlapping requests a chance to show)
        self.api_key = None  # when set, requests need "Authorization: Bearer <api_key>"
        self.lock = threading.Lock()
        self.posts, self.in_flight, self.max_in_flight = 0, 0, 0
        self.bodies: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):  # a client that timed out closed its socket
        pass


def brightness(data_url: str) -> float:
    head, b64 = data_url.split(",", 1)
    assert head in ("data:image/png;base64", "data:image/jpeg;base64"), head
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.float64)
    return float(pixels.mean() / 255.0)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, payload, raw: bytes | None = None) -> None:
        self._leave()  # out of flight before the answer goes out: the client's next request cannot overlap it
        data = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        key = self.server.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._send(401, {"object": "error", "message": "invalid api key"})
        return False

    def do_GET(self):
        if not self._authorized():
            return
        if self.path != "/v1/models":
            return self._send(404, {"object": "error", "message": f"no route {self.path}"})
        self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self):
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.posts += 1
            n = srv.posts
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            srv.bodies.append(body)
        self._in_flight = True
        try:
            if srv.hold == "all" or (srv.hold == "first" and n == 1):
                srv.gate.wait(timeout=120)
            if srv.barrier is not None:
                try:
                    srv.barrier.wait()
                except threading.BrokenBarrierError:
                    return self._send(500, {"object": "error", "message": f"fewer than {srv.barrier.parties} "
                                            "requests were in flight at once"})
            time.sleep(srv.delay)
            self._answer(n, body)
        finally:
            self._leave()

    def _leave(self) -> None:
        if getattr(self, "_in_flight", False):
            with self.server.lock:
                self.server.in_flight -= 1
            self._in_flight = False

    def _answer(self, n: int, body: dict) -> None:
        mode = self.server.mode
        if mode == "500-then-ok" and n == 1:
            return self._send(500, {"object": "error", "message": "engine overloaded"})
        if mode == "400":
            return self._send(400, {"object": "error", "message": "top_logprobs must be <= 5", "code": 400})
        if mode == "non-json":
            return self._send(200, None, raw=b"<html>502 Bad Gateway</html>")
        if mode == "no-choices":
            return self._send(200, {"id": "cmpl-1", "object": "chat.completion"})
        image, text = body["messages"][0]["content"]
        m = brightness(image["image_url"]["url"])
        m = 1.0 - m if "dark" in text["text"] else m
        if body.get("logprobs"):  # yes-no style
            tops = [(" Yes", 0.9 * m), ("yes", 0.1 * m), ("No", 1.0 - m), ("The", 0.001)]
            if mode == "no-yesno":
                tops = [("Maybe", 0.6), ("The", 0.3)]
            top = [{"token": t, "logprob": math.log(max(p, 1e-12))} for t, p in tops]
            content = [{**top[0], "top_logprobs": top}]
            choice = {"index": 0, "message": {"role": "assistant", "content": top[0]["token"]},
                      "logprobs": {"content": content}, "finish_reason": "length"}
        else:  # score style: a decoy number before the marker, two markers on different scales
            answer = f"I count 3 objects. Rating: {10 * m:.6f}\nFinal Score: {1 + 4 * m:.6f}"
            if mode == "no-score":
                answer = "I think it looks fine."
            if mode == "score-out-of-range":
                answer = "Final Score: 7"
            choice = {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
        self._send(200, {"id": f"cmpl-{n}", "object": "chat.completion", "model": MODEL, "choices": [choice]})


@pytest.fixture
def server():
    srv = FakeVLM()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.gate.set()  # held answers go out (to clients that gave up) and their threads end
    srv.shutdown()
    srv.server_close()


def judge(server: FakeVLM, **options) -> VLMJudge:
    options = {"retries": 2, "backoff": 0.01, "timeout_s": 5.0, **options}
    return VLMJudge(server.url, MODEL, **options)


def constant_images(values) -> torch.Tensor:
    """(B, 3, 8, 8), image i constant values[i]."""
    return torch.tensor(values, dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 3, 8, 8).contiguous()


def quantised(values) -> torch.Tensor:
    x = torch.as_tensor(values, dtype=torch.float32)
    return torch.round(x * 255).double() / 255  # what a uint8 PNG keeps (rounded in float32, as the client does)


VALUES = [0.2, 0.5, 0.7, 0.9]
PROMPTS = ["a bright cat", "a dark room", "a red car", "a dark forest"]


def expected(values, prompts) -> torch.Tensor:
    m = quantised(values)
    flip = torch.tensor(["dark" in p for p in prompts])
    return torch.where(flip, 1 - m, m).float()


# -- the two styles ------------------------------------------------------------------------


def test_yes_no_score_is_p_yes_of_each_image_with_its_prompt(server):
    scores = judge(server, style="yes-no")(constant_images(VALUES), PROMPTS)
    assert scores.dtype == torch.float32 and scores.shape == (4,)
    assert torch.allclose(scores, expected(VALUES, PROMPTS), atol=1e-6)
    body = server.bodies[0]
    assert (body["model"], body["temperature"], body["max_tokens"]) == (MODEL, 0, 1)
    assert body["logprobs"] is True and body["top_logprobs"] == 20
    image, text = body["messages"][0]["content"]
    assert image["type"] == "image_url" and image["image_url"]["url"].startswith("data:image/png;base64,")
    assert text["type"] == "text"
    sent = sorted(b["messages"][0]["content"][1]["text"] for b in server.bodies)  # arrival order varies
    assert sent == sorted(f'Does this image show "{p}"? Answer Yes or No.' for p in PROMPTS)


def test_score_style_reads_the_last_number_after_the_marker_and_normalises(server):
    scores = judge(server, style="score")(constant_images(VALUES), PROMPTS)
    assert torch.allclose(scores, expected(VALUES, PROMPTS), atol=1e-5)
    body = server.bodies[0]
    assert body["max_tokens"] == 1024 and "logprobs" not in body and body["temperature"] == 0
    assert "Final Score:" in body["messages"][0]["content"][1]["text"]  # the default question asks for it
    # the marker and the scale act: "Rating: 10 m" on 0..10 is m again; "Final Score" on 0..10 is (1 + 4 m) / 10
    rating = judge(server, style="score", score_marker="Rating:", score_min=0, score_max=10)
    assert torch.allclose(rating(constant_images(VALUES), PROMPTS), expected(VALUES, PROMPTS), atol=1e-5)
    wide = judge(server, style="score", score_min=0, score_max=10, max_tokens=64)
    assert torch.allclose(wide(constant_images(VALUES), PROMPTS), (1 + 4 * expected(VALUES, PROMPTS)) / 10, atol=1e-5)
    assert server.bodies[-1]["max_tokens"] == 64


def test_question_template_and_jpeg_images(server):
    j = judge(server, question="Q: is it {prompt}? {{yes/no}}", image_format="jpeg", top_logprobs=5)
    scores = j(constant_images([0.3, 0.6]), ["a bright sky", "a dark sea"])
    text = server.bodies[0]["messages"][0]["content"][1]["text"]
    assert text in ("Q: is it a bright sky? {yes/no}", "Q: is it a dark sea? {yes/no}")
    assert server.bodies[0]["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert server.bodies[0]["top_logprobs"] == 5
    # jpeg is near lossless on a flat image
    assert torch.allclose(scores, expected([0.3, 0.6], ["a bright sky", "a dark sea"]), atol=0.01)


def test_text_score_parsing():
    assert text_score("Final Score: 2. No wait, **final score:** 4", "Final Score:", 1, 5) == 0.75
    with pytest.raises(MalformedAnswerError, match="outside"):
        text_score("Final Score: 0", "Final Score:", 1, 5)


# -- batching, video -------------------------------------------------------------------------


def test_requests_run_concurrently_up_to_max_concurrency_and_keep_input_order(server):
    # Every POST waits at a 4-party barrier: the 8 requests are answered only if the judge has
    # 4 in flight at once (one after another, the first would break the barrier: HTTP 500).
    server.barrier = threading.Barrier(4, timeout=30)
    values = [0.1 * (i + 1) for i in range(8)]
    prompts = [f"sample {i}" for i in range(8)]
    scores = judge(server, max_concurrency=4, retries=0, timeout_s=60)(constant_images(values), prompts)
    assert server.max_in_flight == 4  # and never more
    assert torch.allclose(scores, quantised(values).float(), atol=1e-6)
    server.barrier, server.max_in_flight, server.delay = None, 0, 0.05
    judge(server, max_concurrency=1)(constant_images(values[:3]), prompts[:3])
    assert server.max_in_flight == 1


def test_video_is_the_mean_of_its_frames(server):
    frames = torch.tensor([[0.2, 0.4, 0.9], [0.5, 0.6, 0.1]])  # (B=2, F=3) brightness per frame
    video = frames.view(2, 3, 1, 1, 1).expand(2, 3, 3, 8, 8).contiguous()  # (B, F, 3, H, W)
    scores = judge(server)(video, ["a clip", "another clip"])
    assert torch.allclose(scores, quantised(frames).mean(dim=1).float(), atol=1e-6)
    assert server.posts == 6
    sampled = judge(server, sample_frames=2)(video, ["a clip", "another clip"])  # frames 0 and 2
    assert torch.allclose(sampled, quantised(frames[:, [0, 2]]).mean(dim=1).float(), atol=1e-6)
    assert server.posts == 6 + 4


# -- failures ----------------------------------------------------------------------------------


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_server_down_is_named_after_retries_quickly(server):
    url = f"http://127.0.0.1:{_closed_port()}"
    waits = []
    with pytest.raises(VLMJudgeError, match="not reachable") as e:
        VLMJudge(url, MODEL, retries=2, backoff=0.01, sleep=waits.append)
    assert url in str(e.value) and "3 attempt(s)" in str(e.value)
    # quickly: two short backoffs, and each attempt refused at once ("not reachable" names a
    # refused connection; an attempt that waited out timeout_s would say "no answer within")
    assert waits == [0.01, 0.02]
    # a server that goes away after the health check
    j = judge(server)
    server.shutdown()
    server.server_close()
    with pytest.raises(VLMJudgeError, match="not reachable") as e:
        j(constant_images([0.5]), ["x"])
    assert server.url in str(e.value)


def test_slow_first_answer_is_retried_and_a_slow_server_times_out(server):
    # Held answers wait for the gate, which opens only at teardown: "slow" is certain. An
    # answered attempt has all of timeout_s (1 s) for a few milliseconds of work.
    server.hold = "first"
    scores = judge(server, timeout_s=1.0)(constant_images([0.4]), ["a cat"])
    assert torch.allclose(scores, quantised([0.4]).float(), atol=1e-6)
    assert server.posts == 2  # the first attempt timed out, the retry answered
    server.hold, server.posts = "all", 0
    with pytest.raises(VLMJudgeError, match=r"no answer within timeout_s=1$") as e:
        judge(server, timeout_s=1.0, retries=1)(constant_images([0.4]), ["a cat"])
    assert "2 attempt(s)" in str(e.value) and server.posts == 2


@pytest.mark.parametrize(
    "mode, style, quoted",
    [
        ("non-json", "yes-no", "502 Bad Gateway"),
        ("no-choices", "yes-no", "chat.completion"),
        ("no-yesno", "yes-no", "Maybe"),
        ("no-score", "score", "looks fine"),
        ("score-out-of-range", "score", "Final Score: 7"),
    ],
)
def test_malformed_answers_raise_quoting_the_answer_or_score_zero(server, mode, style, quoted):
    server.mode = mode
    with pytest.raises(MalformedAnswerError) as e:
        judge(server, style=style)(constant_images([0.5]), ["a cat"])
    assert quoted in str(e.value) and "'a cat'" in str(e.value) and server.url in str(e.value)
    assert server.posts == 1  # a deterministic (temperature 0) answer is not asked again
    zero = judge(server, style=style, on_malformed="zero")(constant_images([0.5, 0.5]), ["a cat", "a dog"])
    assert torch.equal(zero, torch.zeros(2))


def test_http_500_is_retried_and_400_is_not(server):
    server.mode = "500-then-ok"
    scores = judge(server)(constant_images([0.8]), ["a cat"])
    assert torch.allclose(scores, quantised([0.8]).float(), atol=1e-6) and server.posts == 2
    server.mode, server.posts = "400", 0
    with pytest.raises(VLMJudgeError, match="top_logprobs must be <= 5") as e:
        judge(server)(constant_images([0.8]), ["a cat"])
    assert e.value.status == 400 and "not retried" in str(e.value) and server.posts == 1


def test_model_not_served_fails_at_construction(server):
    with pytest.raises(VLMJudgeError, match="does not serve model 'Qwen2.5-VL-7B'") as e:
        VLMJudge(server.url, "Qwen2.5-VL-7B")
    assert MODEL in str(e.value) and server.posts == 0


def test_api_key_from_the_environment(server, monkeypatch):
    server.api_key = "sekret"
    with pytest.raises(VLMJudgeError, match="invalid api key"):
        judge(server)
    with pytest.raises(ValueError, match="api_key_env: the environment variable JUDGE_KEY is not set"):
        judge(server, api_key_env="JUDGE_KEY")
    monkeypatch.setenv("JUDGE_KEY", "sekret")
    assert torch.allclose(judge(server, api_key_env="JUDGE_KEY")(constant_images([0.3]), ["x"]),
                          quantised([0.3]).float(), atol=1e-6)


# -- config ------------------------------------------------------------------------------------


def test_built_by_name_from_reward_paths(server):
    spec = f"url={server.url}&model={MODEL}&style=score&max_concurrency=2"
    load_config(None, ["reward.weights={vlm-judge: 1.0}", f"reward.paths.vlm-judge={spec}"])
    reward = build_reward("vlm-judge", {"vlm-judge": spec}, device="cuda")  # device is not the judge's
    assert reward.name == "vlm-judge" and reward.cfg.max_concurrency == 2
    assert torch.allclose(reward(constant_images(VALUES), PROMPTS), expected(VALUES, PROMPTS), atol=1e-5)


BASE = "url=http://127.0.0.1:8000&model=m"


@pytest.mark.parametrize(
    "value, key",
    [
        ("http://127.0.0.1:8000", "url=http"),  # a bare URL: key=value arguments are needed
        ("model=m", "url"),
        ("url=http://127.0.0.1:8000", "model"),
        ("url=127.0.0.1:8000&model=m", "url"),
        ("url=http://127.0.0.1:8000/v1&model=m", "url"),
        (BASE + "&stlye=score", "stlye"),
        (BASE + "&style=likert", "style"),
        (BASE + "&image_format=webp", "image_format"),
        (BASE + "&on_malformed=skip", "on_malformed"),
        (BASE + "&max_concurrency=0", "max_concurrency"),
        (BASE + "&timeout_s=0", "timeout_s"),
        (BASE + "&retries=-1", "retries"),
        (BASE + "&backoff=-1", "backoff"),
        (BASE + "&sample_frames=0", "sample_frames"),
        (BASE + "&api_key_env=", "api_key_env"),
        (BASE + "&top_logprobs=0", "top_logprobs"),
        (BASE + "&style=score&top_logprobs=5", "top_logprobs"),
        (BASE + "&max_tokens=16", "max_tokens"),
        (BASE + "&score_marker=Score:", "score_marker"),
        (BASE + "&score_min=0", "score_min"),
        (BASE + "&score_max=10", "score_max"),
        (BASE + "&style=score&max_tokens=0", "max_tokens"),
        (BASE + "&style=score&score_marker=%20", "score_marker"),
        (BASE + "&style=score&score_min=5&score_max=1", "score_min"),
        (BASE + "&question=Is it good?", "question"),
        (BASE + "&question=Is it {prompt} in {style}?", "question"),
    ],
)
def test_each_bad_value_is_refused_at_config_naming_its_key(value, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["reward.weights={vlm-judge: 1.0}", f"reward.paths.vlm-judge={value}"])
    assert "reward.paths.vlm-judge" in str(e.value) and key in str(e.value), str(e.value)


@pytest.mark.parametrize("choice", [
    {}, {"logprobs": None}, {"logprobs": {"content": []}}, {"logprobs": {"content": ["Yes"]}},
    {"logprobs": {"content": [{"top_logprobs": [3]}]}},
])
def test_yes_probability_of_answers_without_usable_logprobs_is_a_malformed_answer(choice):
    with pytest.raises(MalformedAnswerError):
        yes_probability(choice)


def test_the_default_score_question_names_the_marker_and_the_range():
    from digenrl.rewards.vlm_judge import JudgeConfig

    cfg = JudgeConfig(url="http://h:1", model="m", style="score", score_marker="{S}:", score_min=0, score_max=10)
    assert "'{S}: <score>', a score from 0 (poor) to 10 (excellent)" in cfg.question.format(prompt="a cat")

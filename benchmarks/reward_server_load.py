"""Load test of the reward server: many concurrent clients, a few bad ones, every answer checked.

    python benchmarks/reward_server_load.py [--clients 64] [--duration-s 60] [--bad-fraction 0.05]
                                            [--replicas 0] [--reward-on auto] [--url http://host:port]
                                            [--auth off|on|both]

Starts `digenrl.runtime.serving.RewardServer` with the JPEG-compressibility reward on a new local Ray
cluster (or loads a server already at --url that serves it) and runs `clients` threads for
`duration_s`, each sending one request at a time on a new connection, like `RemoteReward`
(no retries here: a refused or failed good request counts as lost). Of the requests,
`bad_fraction` are bad, split evenly over four kinds:

    malformed  a body that is not a valid request                  expect 400
    oversized  a Content-Length over max_request_mb                expect 413
    slow       a good body sent in 8 pieces over ~1 s              expect 200 and the right scores
    stalled    half a body, then silence until the server answers  expect 408 (or the connection cut)

With a token (`--auth on`: the server is started with a fresh one; with --url, the token is
$DIGENRL_REWARD_TOKEN), every request carries it, and a fifth kind of bad request joins the mix:

    unauthorized  a good body with a wrong token, or none               expect 401

`--auth both` starts the server without a token and with one, `--pairs` times each in the order
off, on, on, off, off, on, ... (so that a machine whose load drifts favours neither), runs the
same load against each, and prints every report and their requests/s and p50 side by side.

Every good (and slow) answer is compared with the reward computed locally on the same
uint8-quantised images. Prints one JSON report (requests sent/answered/correct per kind,
statuses, connection errors, p50/p99 latency of good requests, throughput) and exits 1 if
any good or slow request was lost or wrong, or a bad one got an unexpected answer.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from digenrl.rewards.toy import JpegCompressibility
from digenrl.rewards.wire import encode_request

REWARD_SPEC = "digenrl.rewards.toy:JpegCompressibility"
EXPECTED = {"malformed": {400}, "oversized": {413}, "stalled": {408, "cut"},
            "unauthorized": {401}}  # good and slow: 200 + right scores


@dataclass
class Tally:
    """What one kind of request got: counts by outcome, latencies of the answered ones."""

    sent: int = 0
    statuses: Counter = field(default_factory=Counter)  # HTTP status, or "cut" / "error:<Exception>"
    correct: int = 0
    wrong: int = 0
    latencies_s: list[float] = field(default_factory=list)


def make_requests(n: int, samples: int, size: int, seed: int) -> list[tuple[bytes, torch.Tensor]]:
    """n good bodies of `samples` (3, size, size) images, each with its locally computed (samples,) scores."""
    g = torch.Generator().manual_seed(seed)
    reward, out = JpegCompressibility(), []
    for _ in range(n):
        images = torch.rand(samples, 3, size, size, generator=g)
        # smooth half the batch so scores spread (noise compresses badly, gradients well)
        images[: samples // 2] = images[: samples // 2].mean(dim=(2, 3), keepdim=True)
        prompts = [f"prompt {i}" for i in range(samples)]
        expected = reward((images * 255).round() / 255, prompts)  # what the server sees after the uint8 wire
        out.append((encode_request(images, prompts, reward=reward.name), expected.float()))
    return out


def _exchange(host: str, port: int, head: bytes, body: bytes, pieces: int, pause_s: float, timeout_s: float):
    """Send head + body (body in `pieces` with `pause_s` between), read the answer: (status, raw body)."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.sendall(head)
        step = -(-len(body) // pieces)
        for i in range(0, len(body), step):
            if i:
                time.sleep(pause_s)
            sock.sendall(body[i : i + step])
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, resp.read()
    finally:
        sock.close()


def _head(length: int, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST /score HTTP/1.1\r\nHost: reward\r\nContent-Type: application/octet-stream\r\n{auth}"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()


def one_request(kind: str, host: str, port: int, good: list, rng: random.Random, limits: dict,
                token: str | None = None) -> tuple:
    """Send one request of `kind` (with `token`, if any); returns (status or "cut"/"error:..", latency_s,
    expected scores or None, raw)."""
    body, expected = good[rng.randrange(len(good))]
    start = time.perf_counter()
    try:
        if kind in ("good", "slow"):
            pieces, pause = (1, 0.0) if kind == "good" else (8, 1.0 / 7)
            status, raw = _exchange(host, port, _head(len(body), token), body, pieces, pause, limits["client_timeout_s"])
        elif kind == "malformed":
            junk = rng.choice([body[: len(body) // 2], b"\x00" * 64, b"not safetensors at all", body[:8] + body[16:]])
            status, raw = _exchange(host, port, _head(len(junk), token), junk, 1, 0.0, limits["client_timeout_s"])
            expected = None
        elif kind == "oversized":
            big = bytes(limits["max_request_bytes"] + 1 + rng.randrange(1 << 16))
            status, raw = _exchange(host, port, _head(len(big), token), big, 1, 0.0, limits["client_timeout_s"])
            expected = None
        elif kind == "unauthorized":  # a good body, a wrong token or none
            wrong = rng.choice([None, secrets.token_urlsafe(32), (token or "")[:-1] + "x"])
            status, raw = _exchange(host, port, _head(len(body), wrong), body, 1, 0.0, limits["client_timeout_s"])
            expected = None
        else:  # stalled: half the body, then nothing until after the server's read timeout
            status, raw = _stall(host, port, body, limits, token)
            expected = None
    except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as e:
        status, raw, expected = ("cut" if kind == "stalled" else f"error:{type(e).__name__}"), b"", expected
    except (OSError, http.client.HTTPException) as e:
        status, raw = f"error:{type(e).__name__}", b""
    return status, time.perf_counter() - start, expected, raw


def _stall(host: str, port: int, body: bytes, limits: dict, token: str | None = None):
    sock = socket.create_connection((host, port), timeout=limits["client_timeout_s"])
    try:
        # The rest never comes, so a 408 is the only right answer whenever the server reads.
        # (Sending it after a pause would race the server: while a reward batch holds its
        # event loop, it cannot see when bytes arrived, and may find the whole body at once.)
        sock.sendall(_head(len(body), token) + body[: len(body) // 2])
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, resp.read()
    finally:
        sock.close()


def run_load(url: str, clients: int, duration_s: float, bad_fraction: float, limits: dict,
             samples: int = 4, size: int = 64, seed: int = 0, token: str | None = None) -> dict:
    """Drive the server at `url` and return the report (see the module docstring). With `token`,
    every request carries it, and the bad requests include unauthorized ones."""
    host, port = url.split("://")[-1].rsplit(":", 1)
    port = int(port)
    good = make_requests(32, samples, size, seed)
    bad_kinds = ["malformed", "oversized", "slow", "stalled"] + (["unauthorized"] if token else [])
    tallies = {k: Tally() for k in ("good", *bad_kinds)}
    lock = threading.Lock()
    stop_at = time.monotonic() + duration_s

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < stop_at:
            kind = rng.choice(bad_kinds) if rng.random() < bad_fraction else "good"
            status, latency, expected, raw = one_request(kind, host, port, good, rng, limits, token)
            ok = None
            if kind in ("good", "slow") and status == 200:
                scores = torch.tensor(json.loads(raw)["scores"], dtype=torch.float32)
                ok = scores.shape == expected.shape and torch.allclose(scores, expected, rtol=0, atol=1e-6)
            with lock:
                t = tallies[kind]
                t.sent += 1
                t.statuses[status] += 1
                if ok is not None:
                    t.correct += ok
                    t.wrong += not ok
                    t.latencies_s.append(latency)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall_s = time.monotonic() - started
    return report(tallies, wall_s, clients, duration_s, bad_fraction, samples)


def report(tallies: dict[str, Tally], wall_s: float, clients: int, duration_s: float, bad_fraction: float,
           samples: int) -> dict:
    g = tallies["good"]
    lat = sorted(g.latencies_s)

    def pct(q: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 1) if lat else None

    lost = {k: t.sent - t.correct for k, t in tallies.items() if k in ("good", "slow")}
    unexpected = {k: sum(n for s, n in t.statuses.items() if s not in EXPECTED[k])
                  for k, t in tallies.items() if k in EXPECTED}
    conn_errors = sum(n for t in tallies.values() for s, n in t.statuses.items() if str(s).startswith("error:"))
    return {
        "clients": clients, "duration_s": duration_s, "wall_s": round(wall_s, 1), "bad_fraction": bad_fraction,
        "auth": "unauthorized" in tallies,
        "samples_per_request": samples,
        "requests": {k: {"sent": t.sent, "statuses": {str(s): n for s, n in sorted(t.statuses.items(), key=str)},
                         **({"correct": t.correct, "wrong": t.wrong} if k in ("good", "slow") else {})}
                     for k, t in tallies.items()},
        "good_lost_or_wrong": lost["good"], "slow_lost_or_wrong": lost["slow"],
        "bad_unexpected": unexpected, "connection_errors": conn_errors,
        "latency_ms": {"p50": pct(0.50), "p99": pct(0.99), "max": round(lat[-1] * 1000, 1) if lat else None},
        "throughput": {"good_requests_per_s": round(g.correct / wall_s, 1),
                       "samples_per_s": round(g.correct * samples / wall_s, 1)},
        "ok": lost["good"] == 0 and lost["slow"] == 0 and not any(unexpected.values()) and g.correct > 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--bad-fraction", type=float, default=0.05)
    ap.add_argument("--samples", type=int, default=4, help="images per good request")
    ap.add_argument("--size", type=int, default=64, help="image side (3 x size x size)")
    ap.add_argument("--replicas", type=int, default=0, help="0: the server's default (one per CPU, at most 4)")
    ap.add_argument("--reward-on", default="auto", help="the server's reward_on: auto, loop or thread")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-request-mb", type=float, default=1.0)
    ap.add_argument("--read-timeout-s", type=float, default=2.0)
    ap.add_argument("--url", help="a running server with the same reward and limits (default: start one)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--auth", choices=("off", "on", "both"), default="off",
                    help="on: the server wants a token (a fresh one; with --url, $DIGENRL_REWARD_TOKEN) and "
                         "unauthorized requests join the bad ones; both: a run without, then one with it")
    ap.add_argument("--pairs", type=int, default=1, help="--auth both: runs of each, alternating (off, on, on, off, ...)")
    args = ap.parse_args()
    limits = {"max_request_bytes": int(args.max_request_mb * 2**20), "read_timeout_s": args.read_timeout_s,
              "client_timeout_s": 60.0}
    command = " ".join(["python", "benchmarks/reward_server_load.py", *sys.argv[1:]])
    pairs = [[False, True] if i % 2 == 0 else [True, False] for i in range(args.pairs)]
    runs = {"off": [False], "on": [True], "both": [auth for pair in pairs for auth in pair]}[args.auth]
    if args.url:
        if args.auth == "both":
            ap.error("--auth both starts its own servers; not with --url")
        result = run_load(args.url, args.clients, args.duration_s, args.bad_fraction, limits, args.samples,
                          args.size, args.seed, token=os.environ.get("DIGENRL_REWARD_TOKEN") if runs[0] else None)
        results = [result]
    else:
        import ray

        ray.init(address="local", include_dashboard=False, log_to_driver=False)  # one cluster for every run
        results = [serve_and_load(args, limits, secrets.token_urlsafe(32) if auth else None) for auth in runs]
    for result in results:
        result["command"] = command
    if len(results) == 1:
        print(json.dumps(results[0], indent=1))
        return 0 if results[0]["ok"] else 1
    print(json.dumps({"runs": results, "compare": compare(results)}, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


def serve_and_load(args, limits: dict, token: str | None) -> dict:
    """Start a server (with `token`, if any), run the load against it, stop it."""
    from digenrl.runtime.serving.reward_server import RewardServer

    with RewardServer(REWARD_SPEC, port=0, replicas=args.replicas, reward_on=args.reward_on, max_batch=args.max_batch,
                      max_request_mb=args.max_request_mb, read_timeout_s=args.read_timeout_s, token=token or "") as server:
        result = run_load(server.url, args.clients, args.duration_s, args.bad_fraction, limits, args.samples,
                          args.size, args.seed, token=token)
        result["server_health_after"] = server.health()
        result["server"] = {"replicas": server.options.replicas, "reward_on": server.options.reward_on,
                            "reward_in_thread": server.options.reward_in_thread}
    return result


def compare(results: list[dict]) -> dict:
    """Good requests/s, p50 and p99 of each run in order, and their medians, auth off against on."""
    import statistics

    rows = [{"auth": "on" if r["auth"] else "off", "good_requests_per_s": r["throughput"]["good_requests_per_s"],
             "p50_ms": r["latency_ms"]["p50"], "p99_ms": r["latency_ms"]["p99"],
             "good_lost_or_wrong": r["good_lost_or_wrong"], "ok": r["ok"],
             "unauthorized": r["requests"].get("unauthorized", {}).get("statuses")} for r in results]
    median = {side: {key: statistics.median(row[key] for row in rows if row["auth"] == side)
                     for key in ("good_requests_per_s", "p50_ms", "p99_ms")}
              for side in ("off", "on") if any(row["auth"] == side for row in rows)}
    return {"runs_in_order": rows, "median": median}


if __name__ == "__main__":
    sys.exit(main())

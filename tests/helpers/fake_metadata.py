"""A cloud's metadata service on 127.0.0.1 (http.server in a thread), answering as the cloud does.

    FakeMetadata("aws" | "gce" | "azure")   .url; .set(answer, node="", seconds=...)
      answers: "not yet" (AWS 404, GCE "FALSE", Azure no Preempt event), "notice" (AWS the
      instance-action JSON, GCE "TRUE", Azure a Preempt event for this VM, NotBefore `seconds`
      ahead), "malformed" (a 200 whose body is not what the cloud sends)
      node: answers for the node whose watcher's base URL is f"{url}/n/{node}" (the watchers of
      one machine's nodes tell themselves apart by "{node_id}" in runtime.rollout.metadata_url)

It checks what the clouds check: AWS wants the IMDSv2 session token from a PUT first (else 401),
GCE the Metadata-Flavor: Google header (else 403), Azure Metadata: true (else 400). GCE's
wait_for_change hangs until the answer changes or timeout_sec passes. `requests` logs
(method, path, headers); `acks` the EventIds Azure was sent in StartRequests.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class FakeMetadata:
    def __init__(self, cloud: str):
        self.cloud = cloud
        self.answers: dict[str, tuple[str, float]] = {}  # node -> (answer, seconds to the deadline)
        self.requests: list[tuple[str, str, dict]] = []
        self.acks: list[str] = []
        self.tokens: set[str] = set()
        self.changed = threading.Condition()
        self.version = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_PUT(self):
                fake._handle(self, "PUT")

            def do_GET(self):
                fake._handle(self, "GET")

            def do_POST(self):
                fake._handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def node_url(self, node: str) -> str:
        return f"{self.url}/n/{node}"

    def set(self, answer: str, node: str = "", seconds: float = 120.0) -> None:
        assert answer in ("not yet", "notice", "malformed"), answer
        with self.changed:
            self.answers[node] = (answer, seconds)
            self.version += 1
            self.changed.notify_all()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeMetadata":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the service ------------------------------------------------------------------------
    def _answer(self, node: str) -> tuple[str, float]:
        return self.answers.get(node, self.answers.get("", ("not yet", 0.0)))

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        path, query = parts.path, parse_qs(parts.query)
        node = ""
        if path.startswith("/n/"):
            _, _, node, path = path.split("/", 3)
            path = "/" + path
        self.requests.append((method, path, {k.lower(): v for k, v in h.headers.items()}))
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0)) if method in ("PUT", "POST") else b""
        status, text, headers = getattr(self, f"_{self.cloud}")(h, method, path, query, node, body)
        data = text.encode()
        h.send_response(status)
        for k, v in {"Content-Length": str(len(data)), **headers}.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _aws(self, h, method, path, query, node, body):
        if method == "PUT" and path == "/latest/api/token":
            if not h.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, "", {}
            token = f"tok-{len(self.tokens)}"
            self.tokens.add(token)
            return 200, token, {}
        if method == "GET" and path == "/latest/meta-data/spot/instance-action":
            if h.headers.get("X-aws-ec2-metadata-token") not in self.tokens:
                return 401, "", {}
            answer, seconds = self._answer(node)
            if answer == "not yet":
                return 404, "<html>404 - Not Found</html>", {}
            if answer == "malformed":
                return 200, '{"action": "terminate", "time": ', {}
            at = (datetime.now(timezone.utc) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
            return 200, json.dumps({"action": "terminate", "time": at}), {}
        return 404, "", {}

    def _gce(self, h, method, path, query, node, body):
        if h.headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing required header: Metadata-Flavor", {}
        if method != "GET" or path != "/computeMetadata/v1/instance/preempted":
            return 404, "", {}

        def current():
            answer, _ = self._answer(node)
            text = {"not yet": "FALSE", "notice": "TRUE", "malformed": "<html>oops</html>"}[answer]
            return text, f"etag-{abs(hash(text)) % 10**8}"

        text, etag = current()
        if query.get("wait_for_change") == ["true"] and query.get("last_etag") == [etag]:
            limit = time.monotonic() + float(query.get("timeout_sec", ["60"])[0])
            with self.changed:
                while current()[1] == etag and time.monotonic() < limit:
                    self.changed.wait(max(0.0, limit - time.monotonic()))
            text, etag = current()
        return 200, text, {"ETag": etag, "Metadata-Flavor": "Google"}

    def _azure(self, h, method, path, query, node, body):
        if h.headers.get("Metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"}), {}
        vm = f"vm-{node or 'only'}"
        if method == "GET" and path == "/metadata/instance/compute/name":
            return 200, vm, {}
        if path != "/metadata/scheduledevents":
            return 404, "", {}
        if method == "POST":
            for start in json.loads(body)["StartRequests"]:
                self.acks.append(start["EventId"])
            return 200, "", {}
        answer, seconds = self._answer(node)
        if answer == "malformed":
            return 200, "{'DocumentIncarnation': 3, Events", {}
        # another VM of the scale set is always being rebooted: not this node's notice
        events = [{"EventId": "other-vm", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                   "Resources": ["vm-elsewhere"], "EventStatus": "Scheduled", "NotBefore": "", "Description": "",
                   "EventSource": "Platform", "DurationInSeconds": -1},
                  {"EventId": f"reboot-{node}", "EventType": "Reboot", "ResourceType": "VirtualMachine",
                   "Resources": [vm], "EventStatus": "Scheduled", "NotBefore": "", "Description": "",
                   "EventSource": "Platform", "DurationInSeconds": -1}]
        if answer == "notice":
            at = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=seconds), usegmt=True)
            events.append({"EventId": f"preempt-{node or 'only'}", "EventType": "Preempt",
                           "ResourceType": "VirtualMachine", "Resources": [vm], "EventStatus": "Scheduled",
                           "NotBefore": at, "Description": "", "EventSource": "Platform", "DurationInSeconds": -1})
        return 200, json.dumps({"DocumentIncarnation": self.version, "Events": events}), {}

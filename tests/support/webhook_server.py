"""A webhook on the loopback, as Slack's are reached: a secret in the path, JSON posted to it, and
answers scripted by the test (each given status once, in order, then 200)."""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET_PATH = "/services/T0SECRET/B0SECRET/xoxb-secret-token"


@dataclass
class Answer:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    body: bytes = b""  # default: "ok", or Slack's word for a 4xx


@dataclass
class Webhook:
    url: str
    answers: list[Answer] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def running_webhook() -> Iterator[Webhook]:
    hook = Webhook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == SECRET_PATH:
                hook.received.append(json.loads(body))
            answer = hook.answers.pop(0) if hook.answers else Answer(200)
            time.sleep(answer.delay_seconds)
            try:
                self.send_response(answer.status if self.path == SECRET_PATH else 404)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                body = answer.body or (b"ok" if answer.status < 400 else b"no_service")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # a client that timed out has gone
                pass

        def log_message(self, format: str, *args: Any) -> None:  # its stderr lines name the path
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hook.url = f"http://127.0.0.1:{server.server_port}{SECRET_PATH}"
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()

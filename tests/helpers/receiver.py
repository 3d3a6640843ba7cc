"""A webhook receiver on loopback: records each POST, can fail or hang on request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, *, fail_first: int = 0, status: int = 500) -> None:
        self.posts: list[dict] = []
        self.requests: list[tuple[dict, bytes]] = []  # each POST's headers and body as sent
        self.fail_first = fail_first
        self.status = status
        self.release = threading.Event()
        self.release.set()  # clear() to make every POST hang until set()
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.arrived:
                    receiver.posts.append(json.loads(body))
                    receiver.requests.append((dict(self.headers), body))
                    failing = len(receiver.posts) <= receiver.fail_first
                    receiver.arrived.notify_all()
                receiver.release.wait(30)
                self.send_response(receiver.status if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 10) -> list[dict]:
        """Block until ``count`` POSTs arrived (bounded); returns them all."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.posts) >= count, timeout):
                raise AssertionError(f"{count} POST(s) expected, got {len(self.posts)}")
            return list(self.posts)

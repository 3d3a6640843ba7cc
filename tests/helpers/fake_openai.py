"""A local OpenAI-compatible server speaking the real streaming wire format.

``FakeOpenAI`` serves ``POST /v1/chat/completions`` on 127.0.0.1 with SSE
(``data: {...}`` chunks, then ``data: [DONE]``). Each request consumes one
scripted reply: a list of chunk dicts, an HTTP status, "hang" or raw bytes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def content_chunks(*pieces: str) -> list[dict]:
    return [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]


def tool_call_chunks(index: int, call_id: str, name: str, *argument_pieces: str) -> list[dict]:
    chunks = [
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    },
                }
            ]
        }
    ]
    for piece in argument_pieces:
        chunks.append(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [{"index": index, "function": {"arguments": piece}}]
                        },
                    }
                ]
            }
        )
    return chunks


class Reply:
    def __init__(
        self,
        *,
        chunks=None,
        status=200,
        hang=False,
        raw=None,
        body=None,
        die_after=None,
        finish_reason="stop",
        pace=0.0,
        hold=None,
    ):
        self.chunks = list(chunks or [])
        if finish_reason:
            # As real servers do: the last chunk carries the finish reason.
            self.chunks.append(
                {"choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]}
            )
        self.status = status
        self.hang = hang
        self.raw = raw
        self.body = body
        self.die_after = die_after  # close the socket after this many chunks
        self.pace = pace  # seconds between chunks, as a model that types
        # An Event the reply waits for (bounded) before it is sent, and one set
        # when its request arrived: a test acts while a process waits on the model.
        self.hold = hold
        self.arrived = threading.Event()


class FakeOpenAI:
    def __init__(
        self,
        models: tuple[str, ...] = ("fake-small", "fake-large"),
        *,
        port: int = 0,
        respond: Callable[[dict], Reply] | None = None,
    ) -> None:
        self.models = list(models)  # what GET /v1/models lists
        self.replies: list[Reply] = []
        # Where scripted replies cannot know the order of requests (a title
        # request beside the run's), a function picks each reply from its request.
        self.respond = respond
        self.requests: list[dict] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append(
                    {"_get": self.path, "_auth": self.headers.get("Authorization", "")}
                )
                if self.path.rstrip("/") != "/v1/models":
                    self.send_error(404)
                    return
                listed = [
                    {"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                    for m in server.models
                ]
                body = json.dumps({"object": "list", "data": listed}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"{}")
                payload["_auth"] = self.headers.get("Authorization", "")
                server.requests.append(payload)
                if server.respond is not None:
                    reply = server.respond(payload)
                elif server.replies:
                    reply = server.replies.pop(0)
                else:
                    reply = Reply(chunks=content_chunks("ok"))
                reply.arrived.set()
                if reply.hang:
                    server.release.wait(30)
                    return
                if reply.hold is not None:
                    reply.hold.wait(60)
                if reply.status != 200:
                    body = json.dumps(
                        reply.body or {"error": {"message": f"fake error {reply.status}"}}
                    ).encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                if reply.raw is not None:
                    self.wfile.write(reply.raw)
                    self.wfile.flush()
                    return
                for i, chunk in enumerate(reply.chunks):
                    if reply.die_after is not None and i >= reply.die_after:
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    base = {
                        "id": "chatcmpl-1",
                        "object": "chat.completion.chunk",
                        "created": int(time.time()),
                        "model": "fake",
                    }
                    self.wfile.write(b"data: " + json.dumps({**base, **chunk}).encode() + b"\n\n")
                    self.wfile.flush()
                    if reply.pace:
                        time.sleep(reply.pace)
                if (payload.get("stream_options") or {}).get("include_usage"):
                    # As real servers do when asked: a last chunk with no choices.
                    usage = {"prompt_tokens": 7, "completion_tokens": len(reply.chunks)}
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                    last = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                            "created": int(time.time()), "model": "fake",
                            "choices": [], "usage": usage}  # fmt: skip
                    self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

"""MCP servers' tools, through the official ``mcp`` SDK's client.

``McpHub`` keeps one client session per server for this process, on an
event loop of its own in a thread of its own (a stuck or chatty server can
never stall the server's loop). A session opens on first use, is reused by
every run, reconnects with backoff after the server crashes or drops the
connection, refreshes its tool list when it reconnects or the server says
the list changed, and closes when the process stops. Runs call it from
their worker threads: a call has the tool timeout, and Stop cancels it.

This module is a pure client: it knows servers by ``ServerSpec`` and reports
what it learns through a callback; ``chat.mcp`` keeps the rows.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from chat.tools.base import LIVE_LINES, LIVE_SECONDS, Progress, Tool, ToolResult
from chat.tools.images import IMAGE_TYPES, human_size, max_bytes, store
from chat.tools.server_sandbox import server_argv
from studio.cancel import CancelToken
from studio.text import strip_nul, strip_nul_json

logger = logging.getLogger(__name__)

SEPARATOR = "__"
# OpenAI-style function names: letters, digits, "_" and "-", at most 64.
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_BACKOFF = 60.0
_EXTENSIONS = {mime: ext for ext, mime in IMAGE_TYPES.items() if ext != ".jpeg"}


class McpUnavailable(Exception):
    """The server cannot be reached now; the message says why (shown to the model)."""


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one server: a command (stdio) or a URL (streamable HTTP)."""

    name: str
    command: tuple[str, ...] = ()
    url: str = ""
    env: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    # A stdio server may reach the network (its sandbox shares the host's).
    network: bool = False


@dataclass(frozen=True)
class RemoteTool:
    name: str
    description: str
    input_schema: dict
    hints: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "hints": list(self.hints),
        }

    @classmethod
    def from_dict(cls, data: dict) -> RemoteTool:
        return cls(
            name=str(data["name"]),
            description=str(data.get("description") or ""),
            input_schema=dict(data.get("input_schema") or {"type": "object"}),
            hints=tuple(data.get("hints") or ()),
        )


@dataclass(frozen=True)
class Report:
    """What the hub learned about a server (for its row): connected, or why not."""

    server: str
    connected: bool
    error: str = ""
    tools: tuple[RemoteTool, ...] = ()


def hints_of(annotations) -> tuple[str, ...]:
    """The server's own words about a tool, as card labels (hints, never trusted)."""
    if annotations is None:
        return ()
    labels = []
    if annotations.read_only_hint:
        labels.append("read-only")
    if annotations.destructive_hint:
        labels.append("destructive")
    if annotations.idempotent_hint:
        labels.append("idempotent")
    if annotations.open_world_hint:
        labels.append("open-world")
    return tuple(labels)


def tool_name(server: str, remote: str) -> str:
    """``<server>__<tool>`` within what OpenAI-style function names allow."""
    return f"{server}{SEPARATOR}{_UNSAFE.sub('_', remote)}"[:64]


def clashing(server: str, remote_names: list[str]) -> dict[str, list[str]]:
    """Studio names two or more of a server's tools would share (``a.b`` and
    ``a_b``, or names alike in their first characters), with the tools': none
    of them is offered, so no rule or card means one while another runs."""
    by_name: dict[str, list[str]] = {}
    for remote in remote_names:
        by_name.setdefault(tool_name(server, remote), []).append(remote)
    return {name: sorted(remotes) for name, remotes in by_name.items() if len(remotes) > 1}


def describe_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, BaseExceptionGroup):
        inner = [describe_error(e) for e in exc.exceptions]
        text = "; ".join(inner) or text
    return text[:500]


class _Connection:
    """One server's session, living on the hub's loop (every method runs there)."""

    def __init__(self, hub: McpHub, spec: ServerSpec) -> None:
        self.hub = hub
        self.spec = spec
        self.client = None
        self.tools: tuple[RemoteTool, ...] = ()
        self.error = ""
        self.failures = 0
        self.retry_at = 0.0
        # Set once a session broke while in use: reconnect by itself, with
        # backoff, until it is back (a server never used connects on demand).
        self.recovering = False
        self.task: asyncio.Task | None = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.closing = False

    @asynccontextmanager
    async def _transport(self):
        import httpx2
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        if self.spec.command:
            command, *args = server_argv(
                self.spec.command, name=self.spec.name, network=self.spec.network
            )
            params = StdioServerParameters(command=command, args=args, env=dict(self.spec.env))
            with open(os.devnull, "w") as errlog:  # the server's stderr is its own business
                async with stdio_client(params, errlog=errlog) as streams:
                    yield streams
        else:
            # The SDK's own defaults: a server may hold its response stream open.
            timeout = httpx2.Timeout(30.0, read=300.0)
            async with httpx2.AsyncClient(headers=dict(self.spec.headers), timeout=timeout) as http:
                async with streamable_http_client(self.spec.url, http_client=http) as streams:
                    yield streams

    async def ensure(self, timeout: float) -> None:
        """Open the session if it is not open; raise ``McpUnavailable`` if it cannot be."""
        if self.client is not None:
            return
        if self.task is None or self.task.done():
            wait = self.retry_at - time.monotonic()
            if wait > 0:
                raise McpUnavailable(
                    f"MCP server '{self.spec.name}' is unavailable ({self.error}); "
                    f"Studio tries again in {wait:.0f} s."
                )
            self.ready = asyncio.Event()
            self.stop = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._serve())
        try:
            await asyncio.wait_for(asyncio.shield(self.ready.wait()), timeout)
        except TimeoutError:
            raise McpUnavailable(
                f"MCP server '{self.spec.name}' did not connect within {timeout:g} s."
            ) from None
        if self.client is None:
            raise McpUnavailable(f"MCP server '{self.spec.name}' is unavailable ({self.error}).")

    async def _serve(self) -> None:
        """Hold the session open until it breaks or the hub closes it."""
        from mcp import Client

        try:
            async with Client(self._transport(), message_handler=self._on_message) as client:
                self.tools = await self._list(client)
                self.client, self.error, self.failures = client, "", 0
                self.recovering = False
                self.hub.report(Report(self.spec.name, True, tools=self.tools))
                self.ready.set()
                await self.stop.wait()
        except Exception as exc:  # noqa: BLE001 - any failure is "unavailable" with its words
            self.error = describe_error(exc)
        finally:
            was_connected, self.client = self.client is not None, None
            self.ready.set()
        if self.closing:
            return
        self.failures += 1
        delay = min(MAX_BACKOFF, 2.0 ** (self.failures - 1))
        self.retry_at = time.monotonic() + delay
        self.hub.report(Report(self.spec.name, False, error=self.error or "connection closed"))
        if was_connected or self.recovering:
            # It crashed or went away while in use: reconnect by itself, later,
            # and again after each failed try (a server restarting takes a while).
            self.recovering = True
            asyncio.get_running_loop().call_later(delay, self._reconnect)

    def _reconnect(self) -> None:
        if not self.closing and self.client is None and (self.task is None or self.task.done()):
            self.ready = asyncio.Event()
            self.stop = asyncio.Event()
            self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _list(self, client) -> tuple[RemoteTool, ...]:
        listing = await client.list_tools()
        return tuple(
            RemoteTool(
                name=t.name,
                description=t.description or t.title or "",
                input_schema=t.input_schema or {"type": "object"},
                hints=hints_of(t.annotations),
            )
            for t in listing.tools
        )

    async def _on_message(self, message) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, Exception):
            self.error = describe_error(message)
            self.stop.set()  # the transport failed: drop the session, reconnect later
        elif isinstance(getattr(message, "root", message), ToolListChangedNotification):
            asyncio.get_running_loop().create_task(self.refresh())

    async def refresh(self) -> tuple[RemoteTool, ...]:
        client = self.client
        if client is not None:
            self.tools = await self._list(client)
            self.hub.report(Report(self.spec.name, True, tools=self.tools))
        return self.tools

    async def call(self, tool: str, arguments: dict, timeout: float, heard=None):
        from mcp.shared.exceptions import MCPError

        await self.ensure(self.hub.connect_timeout)
        try:
            return await self.client.call_tool(
                tool, arguments, read_timeout_seconds=timeout, progress_callback=heard
            )
        except MCPError as exc:
            if "timed out" in str(exc):
                raise TimeoutError from None
            self.error = describe_error(exc)
            self.stop.set()  # the session is gone (the server crashed): start again later
            raise McpUnavailable(
                f"MCP server '{self.spec.name}' failed during the call ({self.error})."
            ) from None

    async def close(self) -> None:
        self.closing = True
        self.stop.set()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait([self.task], timeout=5)


@dataclass
class McpHub:
    """This process's MCP sessions, by server name (see the module docstring)."""

    on_report: Callable[[Report], None] = lambda report: None
    connect_timeout: float = 10.0
    _connections: dict[str, _Connection] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self, report: Report) -> None:
        try:
            self.on_report(report)
        except Exception:
            logger.exception("MCP status report failed")

    def _loop_running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="studio-mcp", daemon=True).start()
                self._loop = loop
            return self._loop

    def _run(self, coro, timeout: float, cancel: CancelToken | None = None, tick=None):
        """Run ``coro`` on the hub's loop and wait for it here; ``tick`` is called
        on this thread while it waits, every LIVE_SECONDS (the live output)."""
        loop = self._loop_running()
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        unsubscribe = (
            cancel.subscribe(lambda: loop.call_soon_threadsafe(future.cancel))
            if cancel is not None
            else (lambda: None)
        )
        try:
            if tick is None:
                return future.result(timeout)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    return future.result(max(0.0, min(LIVE_SECONDS, deadline - time.monotonic())))
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        raise
                    tick()
        finally:
            unsubscribe()

    async def _connection(self, spec: ServerSpec) -> _Connection:
        current = self._connections.get(spec.name)
        if current is not None and current.spec != spec:
            # The admin changed how to reach it: the old session goes.
            await current.close()
            current = None
        if current is None:
            current = self._connections[spec.name] = _Connection(self, spec)
        return current

    def tools(self, spec: ServerSpec, *, timeout: float | None = None) -> tuple[RemoteTool, ...]:
        """The server's tools, connecting first if needed (raises ``McpUnavailable``)."""
        timeout = timeout or self.connect_timeout

        async def tools():
            connection = await self._connection(spec)
            await connection.ensure(timeout)
            return connection.tools

        return self._run(tools(), timeout + 5)

    def refresh(self, spec: ServerSpec, *, timeout: float | None = None) -> tuple[RemoteTool, ...]:
        """Ask the server for its tools again (the admin's "Refresh tools")."""
        timeout = timeout or self.connect_timeout

        async def refresh():
            connection = await self._connection(spec)
            connection.retry_at = 0.0  # an admin asking now does not wait for the backoff
            await connection.ensure(timeout)
            return await connection.refresh()

        return self._run(refresh(), timeout + 5)

    def call(
        self,
        spec: ServerSpec,
        tool: str,
        arguments: dict,
        *,
        timeout: float,
        cancel: CancelToken,
        progress: Progress | None = None,
    ):
        """Call ``tool``; returns the SDK's ``CallToolResult``. ``progress`` hears
        the progress the server reports (its last lines), on this thread.

        Raises ``McpUnavailable``, ``TimeoutError`` past ``timeout``, and
        ``concurrent.futures.CancelledError`` on Stop.
        """
        told = ServerProgress()

        async def call():
            connection = await self._connection(spec)
            return await connection.call(tool, arguments, timeout, told.heard if progress else None)

        tick = (lambda: told.hand_over(progress)) if progress is not None else None
        return self._run(call(), timeout + self.connect_timeout + 5, cancel, tick)

    def forget(self, name: str) -> None:
        """Close a server's session (it was disabled or deleted)."""

        async def forget():
            connection = self._connections.pop(name, None)
            if connection is not None:
                await connection.close()

        if self._loop is not None:
            self._run(forget(), 10)

    def close(self) -> None:
        """Close every session (the process stops)."""
        if self._loop is None:
            return

        async def close_all():
            connections, self._connections = list(self._connections.values()), {}
            await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

        with contextlib.suppress(Exception):
            self._run(close_all(), 10)


# --- the tools the model sees ------------------------------------------------------------------


def result_of(result, *, workspace: Path, tool: str) -> ToolResult:
    """An MCP ``CallToolResult`` as a tool result: text, images saved, structure shown."""
    parts: list[str] = []
    images: list[dict] = []
    structured = result.structured_content
    for number, content in enumerate(result.content, start=1):
        kind = getattr(content, "type", "")
        if kind == "text":
            text = strip_nul(content.text)
            if structured is not None and _same_json(text, structured):
                if isinstance(structured, dict) and set(structured) == {"result"}:
                    structured = None  # just a wrapped text: the text says it all
                    parts.append(text)
                continue  # the text copy of the structured content, shown below
            parts.append(text)
        elif kind == "image":
            images.append(_save_image(content, workspace=workspace, stem=f"{tool}-{number}"))
        elif kind == "resource_link":
            parts.append(f"[resource: {content.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content not shown]")
    if structured is not None:
        parts.append(json.dumps(strip_nul_json(structured), indent=2, ensure_ascii=False))
    images = [image for image in images if image]
    text = "\n".join(part for part in parts if part).strip() or "(no output)"
    if images:
        listed = ", ".join(f"{i['name']} ({human_size(i['size'])})" for i in images)
        text += f"\n[Images returned: {listed}. They are shown to the user.]"
    if result.is_error:
        return ToolResult(f"Error: {text}", ok=False, images=tuple(images))
    return ToolResult(text, images=tuple(images))


def _same_json(text: str, value) -> bool:
    """``text`` says what the structured ``value`` says (so it is shown once)."""
    wrapped = isinstance(value, dict) and set(value) == {"result"}
    if wrapped and value["result"] == text:
        return True  # a plain return value, wrapped by the server
    try:
        said = json.loads(text)
    except ValueError:
        return False
    # (A number or a list is wrapped too: the text "5" says {"result": 5}.)
    return said == value or (wrapped and said == value["result"])


def _save_image(content, *, workspace: Path, stem: str) -> dict:
    from chat.tools.sandbox import prepare_workspace, sandbox_ids

    try:
        data = base64.b64decode(content.data, validate=True)
    except (binascii.Error, ValueError):
        return {}
    extension = _EXTENSIONS.get(content.mime_type)
    if extension is None:
        return {}
    prepare_workspace(workspace)
    folder = workspace / "mcp-images"
    folder.mkdir(exist_ok=True)
    path = folder / f"{_UNSAFE.sub('_', stem)}-{time.time_ns()}{extension}"
    path.write_bytes(data)
    ids = sandbox_ids(workspace)
    if ids is not None:  # the conversation's own tools may read and delete it
        os.chown(folder, *ids)
        os.chown(path, *ids)
    shown = len(data) <= max_bytes()
    image = {
        "name": str(path.relative_to(workspace)),
        "size": len(data),
        "mime": content.mime_type,
        "shown": shown,
    }
    if shown:  # pages serve Studio's own copy, never the workspace's file
        image["key"] = store(workspace=workspace, name=path.name, data=data)
    return image


class ServerProgress:
    """What a server reported of a call's progress: heard on the hub's loop,
    handed over on the call's own thread (the step's publisher is that thread's)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.last: list[str] | None = None  # the lines handed over last

    async def heard(self, progress: float, total: float | None, message: str | None) -> None:
        done = f"{progress:g}" + (f" of {total:g}" if total else "")
        self.lines = [*self.lines, f"{done}: {message}" if message else done][-LIVE_LINES:]

    def hand_over(self, progress: Progress) -> None:
        lines = self.lines  # one read: the loop replaces the list, never changes it
        if lines and lines is not self.last:
            self.last = lines
            progress("\n".join(lines))


def remote_tool(
    hub: McpHub, spec: ServerSpec, remote: RemoteTool, *, description_prefix: str = ""
) -> Tool:
    """A server's tool as a Studio tool, gated like any other."""

    def run(
        arguments: dict,
        *,
        cancel: CancelToken,
        timeout: float,
        workspace: Path,
        progress: Progress | None = None,
    ):
        from concurrent.futures import CancelledError

        try:
            result = hub.call(
                spec, remote.name, arguments, timeout=timeout, cancel=cancel, progress=progress
            )
        except McpUnavailable as exc:
            return ToolResult.error(str(exc))
        except TimeoutError:
            return ToolResult.error(f"the MCP tool did not answer within {timeout:g} s.")
        except CancelledError:
            return ToolResult.error("stopped by the user.")
        return result_of(result, workspace=workspace, tool=remote.name)

    return Tool(
        name=tool_name(spec.name, remote.name),
        description=(description_prefix + remote.description).strip()[:1024],
        parameters=remote.input_schema,
        run=run,
        server=spec.name,
        hints=remote.hints,
        live=True,
    )

"""Agent runs: started on a bounded pool of our own, one per conversation.

A run belongs to its conversation, not to a socket: closing a tab does not
stop it, and its pending approvals stay decidable from any tab or process.
The run's events are rendered to HTML fragments here, in the worker thread,
and sent to the conversation's group, so every tab in every process sees
them. Stop reaches the run wherever it lives: directly in this process, or
through the hosting process's inbox.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections
from django.utils.html import escape

from approvals.inbox import current_inbox, ensure_inbox, register_handler
from approvals.notify import group_send, layer_send
from chat import render
from chat.agent import Agent, Event
from chat.llm import get_model
from chat.models import Conversation, Message, Run
from chat.services import RunBusy, run_create, run_finish, run_heartbeat
from studio.cancel import CancelToken

logger = logging.getLogger(__name__)

# Worker threads of our own: a waiting run holds one for up to an hour, so
# neither the default executor nor the thread-sensitive thread may be used.
AGENT_POOL = ThreadPoolExecutor(
    max_workers=settings.STUDIO_AGENT_WORKERS, thread_name_prefix="studio-agent"
)
FLUSH_SECONDS = 0.05
# Housekeeping gets its own thread so a full AGENT_POOL cannot starve it.
_MAINTENANCE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="studio-maint")


@dataclass
class LocalRun:
    run_id: str
    conversation_id: int
    cancel: CancelToken


_lock = threading.Lock()
_local: dict[str, LocalRun] = {}
_reserved = 0
_tasks: set[asyncio.Task] = set()
_heartbeat: dict[str, asyncio.Task | None] = {"task": None}


def _heartbeat_once() -> None:
    try:
        run_heartbeat(run_ids=list(local_runs()))
    finally:
        connections.close_all()


async def _heartbeat_loop() -> None:
    """Tell the database this process's runs are alive (see STUDIO_RUN_STALE_SECONDS)."""
    while True:
        await asyncio.sleep(settings.STUDIO_RUN_HEARTBEAT_SECONDS)
        try:
            await sync_to_async(_heartbeat_once, thread_sensitive=False, executor=_MAINTENANCE)()
        except Exception:
            logger.warning("run heartbeat failed", exc_info=True)


def _ensure_heartbeat() -> None:
    task = _heartbeat["task"]
    loop = asyncio.get_running_loop()
    if task is None or task.done() or task.get_loop() is not loop:
        _heartbeat["task"] = loop.create_task(_heartbeat_loop())


@dataclass(frozen=True)
class Launch:
    ok: bool
    # "busy" (pool full) | "running" (conversation has a run) | "empty" | "gone"
    reason: str = ""
    run_id: str = ""


def _reserve() -> bool:
    global _reserved
    with _lock:
        if len(_local) + _reserved >= settings.STUDIO_AGENT_WORKERS:
            return False
        _reserved += 1
        return True


def _unreserve() -> None:
    global _reserved
    with _lock:
        _reserved -= 1


def local_runs() -> dict[str, LocalRun]:
    with _lock:
        return dict(_local)


def cancel_local(run_id: str) -> bool:
    with _lock:
        local = _local.get(run_id)
    if local is None:
        return False
    local.cancel.cancel()
    return True


def _cancel_from_message(message: dict) -> None:
    cancel_local(str(message.get("run_id", "")))


register_handler("run.cancel", _cancel_from_message)


async def run_launch(*, conversation_id: int, user, text: str) -> Launch:
    """Save the user's message and start a run for it (async: call from the loop)."""
    if not text.strip():
        return Launch(ok=False, reason="empty")
    if not _reserve():
        return Launch(ok=False, reason="busy")
    try:
        inbox = await ensure_inbox()
        _ensure_heartbeat()
        try:
            run = await sync_to_async(run_create, thread_sensitive=False, executor=AGENT_POOL)(
                conversation_id=conversation_id,
                user=user,
                text=text,
                inbox=inbox,
                # Without Redis there is one process: a running run it does not
                # host died with a previous server (restart, crash).
                is_dead=None if settings.REDIS_URL else (lambda run_id: run_id not in local_runs()),
            )
        except RunBusy:
            return Launch(ok=False, reason="running")
        except Conversation.DoesNotExist:
            return Launch(ok=False, reason="gone")
        local = LocalRun(run_id=str(run.pk), conversation_id=conversation_id, cancel=CancelToken())
        with _lock:
            _local[local.run_id] = local
    finally:
        _unreserve()
    task = asyncio.get_running_loop().create_task(
        sync_to_async(run_drive, thread_sensitive=False, executor=AGENT_POOL)(local)
    )
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return Launch(ok=True, run_id=local.run_id)


def run_stop(*, conversation_id: int, user) -> bool:
    """Stop the conversation's running run, in this process or another."""
    run = (
        Run.objects.running()
        .filter(conversation_id=conversation_id, conversation__owner=user)
        .only("id", "inbox")
        .first()
    )
    if run is None:
        return False
    if cancel_local(str(run.pk)):
        return True
    if run.inbox and run.inbox != current_inbox():
        return layer_send(run.inbox, {"type": "run.cancel", "run_id": str(run.pk)})
    return False


class Publisher:
    """Renders a run's events into fragments for the conversation's group.

    Content deltas are buffered and flushed at most every FLUSH_SECONDS, so a
    fast model costs a handful of channel messages, not one per token.
    """

    def __init__(self, conversation: Conversation, run: Run) -> None:
        self.group = conversation.group_name
        self.run = run
        self.turn = 0
        self.stream_open = False
        self.buffer: list[str] = []
        self.last_flush = 0.0

    @property
    def stream_id(self) -> str:
        return f"stream-{self.run.pk}-{self.turn}"

    def send(self, html: str) -> None:
        group_send(self.group, {"type": "chat.fragment", "html": html})

    def content(self, text: str) -> None:
        if not self.stream_open:
            self.stream_open = True
            self.send(render.stream_open(self.stream_id))
        self.buffer.append(text)
        now = time.monotonic()
        if now - self.last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            text = "".join(self.buffer)
            self.buffer.clear()
            self.last_flush = time.monotonic()
            self.send(f'<div hx-swap-oob="beforeend:#{self.stream_id}-body">{escape(text)}</div>')

    def event(self, event: Event) -> None:
        kind, data = event.kind, event.data
        if kind == "content":
            self.content(data["text"])
            return
        self.flush()
        if kind == "status":
            self.send(render.run_status(data["text"]))
        elif kind == "message_end":
            # Drop the streaming bubble, append the final message (a tab that
            # reconnected mid-stream never had the bubble, and still gets this).
            drop = (
                f'<div id="{self.stream_id}" hx-swap-oob="delete"></div>'
                if self.stream_open
                else ""
            )
            self.send(drop + render.appended(render.message(data["message"])))
            self.turn += 1
            self.stream_open = False
        elif kind == "tool_end" and data.get("approval") is not None:
            self.send(render.tool_output(data))
        elif kind in ("tool_start", "tool_end"):
            self.send(render.tool_block_for_event(data))
            if kind == "tool_start" and data["awaiting_confirmation"]:
                self.send(render.run_status("Waiting for your decision…"))
        elif kind == "error":
            self.send(render.appended(render.message(data["message"])))


def run_drive(local: LocalRun) -> None:
    """The body of one run, in an AGENT_POOL worker thread."""
    close_old_connections()
    publisher = None
    status, error = Run.Status.DONE, ""
    try:
        run = Run.objects.select_related("conversation", "started_by").get(pk=local.run_id)
        conversation = run.conversation
        publisher = Publisher(conversation, run)
        user_message = (
            Message.objects.filter(run=run, role=Message.Role.USER).order_by("-id").first()
        )
        if user_message is not None:
            publisher.send(render.appended(render.message(user_message)))
        publisher.send(render.run_controls(running=True, conversation_id=local.conversation_id))
        # The first message names the conversation; every open tab shows it.
        publisher.send(
            f'<h1 id="conversation-title" hx-swap-oob="outerHTML">{escape(conversation.title)}</h1>'
        )
        agent = Agent(
            conversation=conversation,
            model=get_model(),
            cancel=local.cancel,
            user=run.started_by,
            run=run,
        )
        for event in agent.events():
            publisher.event(event)
            if event.kind == "error":
                status, error = Run.Status.ERROR, event.data["text"]
            elif event.kind == "done" and event.data.get("cancelled"):
                status = Run.Status.CANCELLED
    except Exception as exc:
        logger.exception("run %s failed", local.run_id)
        status, error = Run.Status.ERROR, f"{type(exc).__name__}: {exc}"
        if publisher is not None:
            try:
                message = Message.objects.create(
                    conversation_id=local.conversation_id,
                    run_id=local.run_id,
                    role=Message.Role.ERROR,
                    content="Something went wrong in Studio while running this. "
                    "The conversation is saved; you can try again.",
                )
                publisher.send(render.appended(render.message(message)))
            except Exception:
                logger.exception("could not record the failure of run %s", local.run_id)
    finally:
        try:
            run_finish(run_id=local.run_id, status=status, error=error)
            if publisher is not None:
                publisher.flush()
                publisher.send(render.run_status(""))
                publisher.send(
                    render.run_controls(running=False, conversation_id=local.conversation_id)
                )
        finally:
            with _lock:
                _local.pop(local.run_id, None)
            connections.close_all()

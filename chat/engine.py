"""Agent runs: stepped on worker threads, parked on the event loop.

A run belongs to its conversation, not to a socket: closing a tab does not
stop it, and its pending approvals stay decidable from any tab or process.

The agent loop is plain synchronous code (``chat.agent``). A *step* runs it
on an ``agent_pool`` thread until it either ends or yields ``Park`` (a call
waits for a decision). Then the thread is given back: the run is a
coroutine waiting on the slot's wake, on Stop or on its deadline, costing
memory only. ``STUDIO_AGENT_WORKERS`` bounds runs that are *working*; any
number may wait.

The run's events become HTML fragments in the step's thread and go to the
conversation's group through the runtime's outbox (ordered, never blocking),
so every tab in every process sees them. Stop reaches the run wherever it
lives: directly here, or through the hosting process's inbox.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections

from approvals.services.waiting import poll_wait
from chat import events, render
from chat.agent import Agent
from chat.display import MessageView
from chat.llm import get_model
from chat.models import Conversation, Message, Run
from chat.services import RunBusy, run_create, run_finish, run_heartbeat
from chat.toolbox import toolbox_for
from studio.runtime import Later, LocalRun, Runtime, release_connection, runtime

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 0.05
# A status line ("Thinking…", "Running python…") is sent only once what it
# announces has taken this long; a quicker step's status leaves with its
# result, in one message (see Publisher.flush).
STATUS_SECONDS = 0.15
# How long shutdown waits for runs to record that they were cancelled.
SHUTDOWN_SECONDS = 3.0

REFUSALS = {
    "running": "The agent is still working on your previous message. "
    "Wait for it to finish, or press Stop. Your message was not sent.",
    "empty": "Type a message first.",
    "gone": "This conversation no longer exists.",
    "down": "The server is shutting down; your message was not sent. Try again in a moment.",
}


@dataclass(frozen=True)
class Launch:
    ok: bool
    reason: str = ""  # a key of REFUSALS
    run_id: str = ""

    @property
    def refusal(self) -> str:
        return REFUSALS.get(self.reason, "")


# --- starting and stopping ------------------------------------------------------------


def run_launch(*, conversation_id: int, user, text: str) -> Launch:
    """Save the user's message and start a run for it (blocking: call off the loop)."""
    if not text.strip():
        return Launch(ok=False, reason="empty")
    rt = runtime()
    if rt.loop is None or not rt.loop.is_running():
        return Launch(ok=False, reason="down")
    local = LocalRun(run_id=str(uuid.uuid4()), conversation_id=conversation_id)
    # Live before its row exists: a send racing this one in another tab must
    # see this run as alive, never as a dead one to retire.
    with rt.lock:
        rt.runs[local.run_id] = local
    try:
        local.launched = run_create(
            run_id=local.run_id,
            conversation_id=conversation_id,
            user=user,
            text=text,
            inbox=rt.inbox.name,
            # Without Redis there is one process: a running run it does not
            # host died with a previous server (restart, crash).
            is_dead=None if settings.REDIS_URL else (lambda run_id: run_id not in rt.local_runs()),
        )
    except (RunBusy, Conversation.DoesNotExist) as exc:
        with rt.lock:
            rt.runs.pop(local.run_id, None)
        return Launch(ok=False, reason="running" if isinstance(exc, RunBusy) else "gone")
    if not rt.call_soon(_start_driving, rt, local):
        local.cancel.cancel()
        with rt.lock:
            rt.runs.pop(local.run_id, None)
        run_finish(run_id=local.run_id, status=Run.Status.CANCELLED, error="server shutting down")
        return Launch(ok=False, reason="down")
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
    rt = runtime()
    local = rt.local_runs().get(str(run.pk))
    if local is not None:
        local.cancel.cancel()
        return True
    if run.inbox and run.inbox != rt.inbox.name:
        rt.outbox.channel(run.inbox, {"type": "run.cancel", "run_id": str(run.pk)})
        return True
    return False


def cancel_from_message(message: dict) -> None:
    """Inbox handler for ``run.cancel`` sent by the process where Stop was pressed."""
    local = runtime().local_runs().get(str(message.get("run_id", "")))
    if local is not None:
        local.cancel.cancel()


# --- driving ------------------------------------------------------------------------------


def _start_driving(rt: Runtime, local: LocalRun) -> None:
    local.task = asyncio.get_running_loop().create_task(drive(rt, local))


async def drive(rt: Runtime, local: LocalRun) -> None:
    """The life of one run: steps on the agent pool, parks in between."""
    stepper = Stepper(local)
    loop = asyncio.get_running_loop()
    try:
        while (park := await loop.run_in_executor(rt.agent_pool, stepper.step)) is not None:
            local.parked = True
            try:
                await _parked(park, local)
            finally:
                local.parked = False
    except Exception:
        logger.exception("run %s: driver failed", local.run_id)
    finally:
        with rt.lock:
            rt.runs.pop(local.run_id, None)


async def _parked(park: events.Park, local: LocalRun) -> None:
    """Hold no thread until the call is decided, Stop is pressed or time is up."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake() -> None:  # from any thread: the decision's, the poller's, Stop's
        loop.call_soon_threadsafe(_resolve, woken)

    unsubscribe_slot = park.slot.on_wake(wake)
    unsubscribe_cancel = local.cancel.subscribe(wake)
    park.slot.waiting = True
    try:
        wait = min(
            park.deadline - time.monotonic(), poll_wait(settings.STUDIO_APPROVAL_POLL_SECONDS)
        )
        if wait > 0:
            try:
                await asyncio.wait_for(woken, wait)
            except TimeoutError:
                pass  # the next step looks at the row itself
    finally:
        park.slot.waiting = False
        unsubscribe_slot()
        unsubscribe_cancel()


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Stepper:
    """Steps one run's agent on worker threads; publishes its events as fragments."""

    def __init__(self, local: LocalRun) -> None:
        self.local = local
        self.agent_events = None
        self.agent: Agent | None = None
        self.publisher: Publisher | None = None
        self.parked: events.Park | None = None
        self.status, self.error = Run.Status.DONE, ""

    def step(self) -> events.Park | None:
        """Run until the agent parks (returns the ``Park``) or the run ends (None)."""
        close_old_connections()
        try:
            if self.agent_events is None:
                self._begin()
            if self.parked is not None:
                # A decision made here may have handed over its card: it
                # leaves with this step's first fragments.
                self.publisher.carry(self.parked.slot.take_card())
                self.parked = None
            while True:
                event = next(self.agent_events)
                if isinstance(event, events.Park):
                    self.publisher.flush()
                    self.parked = event
                    return event
                self._track(event)
                self.publisher.event(event)
        except StopIteration:
            self._end()
            return None
        except Exception as exc:
            logger.exception("run %s failed", self.local.run_id)
            self.status, self.error = Run.Status.ERROR, f"{type(exc).__name__}: {exc}"
            self._report_crash()
            self._end()
            return None
        finally:
            release_connection()

    def _begin(self) -> None:
        # The rows the launch wrote, with the conversation it read: not read again.
        (run, user_message), self.local.launched = self.local.launched, None
        conversation = run.conversation
        self.publisher = Publisher(conversation, run)
        self.publisher.send(render.appended(render.message(MessageView.of(user_message))))
        self.publisher.send(render.run_controls(running=True, conversation_id=conversation.pk))
        # The first message names the conversation; every open tab shows it.
        self.publisher.send(render.title(conversation.title))
        self.publisher.flush()
        agent = self.agent = Agent(
            conversation=conversation,
            model=get_model(),
            cancel=self.local.cancel,
            user=run.started_by,
            run=run,
            # MCP servers never reached yet are asked for their tools now, on
            # this worker thread (lazily, and never on a page load).
            toolbox=toolbox_for(conversation, connect=True),
        )
        self.agent_events = agent.events()

    def _track(self, event: events.Event) -> None:
        match event:
            case events.Failed(text=text):
                self.status, self.error = Run.Status.ERROR, text
            case events.Done(cancelled=True):
                self.status = Run.Status.CANCELLED

    def _report_crash(self) -> None:
        if self.publisher is None:
            return
        try:
            message = Message.objects.create(
                conversation_id=self.local.conversation_id,
                run_id=self.local.run_id,
                role=Message.Role.ERROR,
                content="Something went wrong in Studio while running this. "
                "The conversation is saved; you can try again.",
            )
            self.publisher.send(render.appended(render.message(MessageView.of(message))))
            self.publisher.flush()
        except Exception:
            logger.exception("could not record the failure of run %s", self.local.run_id)
        if self.agent_events is not None:
            self.agent_events.close()  # cancels its pending rows and slots

    def _end(self) -> None:
        run_finish(run_id=self.local.run_id, status=self.status, error=self.error)
        if self.publisher is not None:
            self.publisher.send(render.run_status(""))
            self.publisher.send(
                render.run_controls(running=False, conversation_id=self.local.conversation_id)
            )
            if self.agent is not None and self.agent.toolbox.learned:
                # The MCP tools this run found for the first time join the panel.
                conversation = self.agent.conversation
                self.publisher.send(render.settings_panel(conversation, oob=True))
            self.publisher.flush()


class Publisher:
    """Renders a run's events into fragments for the conversation's group.

    Fragments are gathered and sent as one channel message at the points
    where the run is about to wait (a status line before a tool or the model
    works, a pending card, the end), so a quick tool costs a few messages,
    not one per fragment. Content deltas go out at most every FLUSH_SECONDS.
    A status line with nothing else to send waits STATUS_SECONDS: a model or
    tool quicker than that sends its status together with its result.
    """

    def __init__(self, conversation: Conversation, run: Run) -> None:
        self.group = conversation.group_name
        self.run_id = run.pk
        self.outbox = runtime().outbox
        self.turn = 0
        self.stream_open = False
        self.pending: list[str] = []
        # The batch holds a result the member waits for: deliver it before
        # the run goes on (see Outbox.group's ``wait``).
        self.urgent = False
        self.deltas: list[str] = []
        self.last_flush = 0.0
        # The last flush, when it was delayed (a status line).
        self.later: Later | None = None

    @property
    def stream_id(self) -> str:
        return f"stream-{self.run_id}-{self.turn}"

    def send(self, html: str) -> None:
        """Queue ``html``; it leaves with the next flush."""
        self.pending.append(html)

    def carry(self, later: Later | None) -> None:
        """Take a message already on a timer (a decided card) along with the next flush.

        It goes first in that flush if its timer has not sent it by then.
        """
        if later is not None and self.later is None:
            self.later = later

    def flush(self, *, delay: float = 0.0) -> None:
        """Send what is queued (and the buffered deltas) as one message.

        ``delay``: send it that much later, unless the next flush comes first
        and takes it along (never when it holds a result: see ``urgent``).
        """
        if self.deltas:
            if not self.stream_open:
                self.stream_open = True
                self.pending.append(render.stream_open(self.stream_id))
            self.pending.append(render.stream_delta(self.stream_id, "".join(self.deltas)))
            self.deltas.clear()
        if not self.pending:
            return
        html = "".join(self.pending)
        self.pending.clear()
        if self.later is not None:
            if self.later.take_back():
                html = self.later.message["html"] + html  # not sent yet: it goes first, in this one
            self.later = None
        self.last_flush = time.monotonic()
        message = {"type": "chat.fragment", "html": html}
        if delay and not self.urgent:
            self.later = self.outbox.group_later(self.group, message, delay)
            return
        self.outbox.group(self.group, message, wait=self.urgent)
        self.urgent = False

    def event(self, event: events.Event) -> None:
        match event:
            case events.Delta(text=text):
                self.deltas.append(text)
                if time.monotonic() - self.last_flush >= FLUSH_SECONDS:
                    self.flush()
            case events.Status(text=text):
                # Something that may be slow comes next (the model, a tool):
                # show what came before now, and the status line alone only
                # if that something is slow (else it goes with what follows).
                alone = not self.pending and not self.deltas
                self.send(render.run_status(text))
                self.flush(delay=STATUS_SECONDS if alone else 0.0)
            case events.TurnSaved():
                # Drop the streaming bubble, append the final message (a tab
                # that reconnected mid-stream never had the bubble, and still
                # gets this).
                self.deltas.clear()
                drop = render.stream_drop(self.stream_id) if self.stream_open else ""
                self.send(drop + render.appended(render.turn_saved(event)))
                self.turn += 1
                self.stream_open = False
            case events.ToolStarted(awaiting=awaiting):
                self.send(render.tool_started(event))
                if awaiting:
                    self.send(render.run_status("Waiting for your decision…"))
                    self.flush()
            case events.TurnAsked(message_id=message_id, approval_ids=approval_ids):
                self.send(render.batch(message_id, approval_ids))
            case events.ToolFinished():
                self.send(render.tool_finished(event))
                self.urgent = True
            case events.Failed(message_id=message_id, text=text, created_at=created_at):
                view = MessageView(message_id, Message.Role.ERROR, text, created_at)
                self.send(render.appended(render.message(view)))
            case events.Done():
                pass


# --- process services (registered with the runtime at start-up) ---------------------------


async def heartbeat(rt: Runtime) -> None:
    """Tell the database this process's runs are alive (see STUDIO_RUN_STALE_SECONDS)."""
    while True:
        await asyncio.sleep(settings.STUDIO_RUN_HEARTBEAT_SECONDS)
        try:
            await rt.off_loop(run_heartbeat, inbox=rt.inbox.name)
        except Exception:
            logger.warning("run heartbeat failed", exc_info=True)


async def cancel_all(rt: Runtime) -> None:
    """Shutdown: Stop every run here and give them a moment to record it."""
    runs = list(rt.local_runs().values())
    for local in runs:
        local.cancel.cancel()
    tasks = [local.task for local in runs if local.task is not None and not local.task.done()]
    if tasks:
        done, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_SECONDS)
        if pending:
            logger.warning(
                "%d run(s) did not stop in %.0f s; another process or purge_approvals "
                "will expire them",
                len(pending),
                SHUTDOWN_SECONDS,
            )

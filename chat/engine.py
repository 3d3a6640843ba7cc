"""Agent runs: stepped on worker threads; in between, only rows.

A run belongs to its conversation, not to a socket or a process: closing a
tab does not stop it, and its pending calls stay decidable from any tab or
process. A *step* runs the agent (``chat.agent``) on an ``agent_pool``
thread, from where the rows say the run is, until a call waits for a
decision or the run ends. A waiting run holds no thread, no coroutine and no
memory anywhere: it is its rows, with no owner.

Whoever lets it go on resumes it: the process that records a decision (or a
timeout, or Stop) claims the run with a conditional update, first claim
wins, and steps it. Each process's sweep also claims runs left resumable by
a process that exited, runs whose process died (its heartbeat went stale),
and any decided run whose resume message was lost. ``STUDIO_AGENT_WORKERS``
bounds the steps working at once.

The run's events become HTML fragments in the step's thread and go to the
conversation's group through the runtime's outbox, so every tab in every
process sees them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
import time
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from approvals.services.waiting import approval_cancel_run
from chat import events, render
from chat.agent import Agent
from chat.display import MessageView
from chat.llm import get_model
from chat.models import Conversation, Message, Run
from chat.runs.local import LocalRun, local_runs
from chat.runs.state import (
    Claim,
    Fenced,
    approval_pending,
    run_claim,
    run_fence,
    run_finish,
    run_heartbeat,
    run_release,
    run_stop_request,
    runs_abandon,
    runs_forget_process,
    runs_to_resume,
)
from chat.services import (
    ForkRefused,
    RunBusy,
    conversation_retryable,
    conversation_title_from_model,
    editable_message,
    python_sessions_reset,
    regenerate_point,
    run_create,
)
from chat.toolbox import toolbox_for
from chat.tools.sessions import SESSIONS
from studio.logs import log_context
from studio.runtime import Runtime, release_connection, runtime, shared_channel

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 0.05
# The sweep re-reads every waiting run this often, besides its quick look at
# the calls decided since its last one.
FULL_SWEEP_SECONDS = 60.0
# A run handed over by a process that steps none: how long the process it
# prefers (where its python session is) has to claim it before any other may.
PREFERRED_FIRST_SECONDS = 1.0

RESUMED_TEXT = "The server restarted; your run continues."
REFUSALS = {
    "running": "The agent is still working on your previous message. "
    "Wait for it to finish, or press Stop. Your message was not sent.",
    "empty": "Type a message first.",
    "gone": "This conversation no longer exists.",
    "down": "The server is shutting down; your message was not sent. Try again in a moment.",
    "nothing": "There is nothing to retry.",
    "unasked": "There is no reply to regenerate yet.",
    "moved": "That message was replaced meanwhile; edit the one shown now.",
}


@dataclass(frozen=True)
class Launch:
    ok: bool
    reason: str = ""  # a key of REFUSALS
    run_id: str = ""

    @property
    def refusal(self) -> str:
        return REFUSALS.get(self.reason, "")


# --- starting, resuming and stopping ------------------------------------------------------


def run_launch(*, conversation_id: int, user, text: str) -> Launch:
    """Save the user's message and start a run for it (blocking: call off the loop)."""
    if not text.strip():
        return Launch(ok=False, reason="empty")
    return _launch(conversation_id, user, text)


def run_retry(*, conversation_id: int, user) -> Launch:
    """Ask the model again after a run that ended in an error (blocking: call off the loop)."""
    if not conversation_retryable(conversation_id):
        return Launch(ok=False, reason="nothing")
    return _launch(conversation_id, user, None)


def run_regenerate(*, conversation_id: int, user) -> Launch:
    """Run the last turn again: what answered the member's last message is folded
    away as an earlier version (blocking: call off the loop)."""
    asked, fork_from = regenerate_point(conversation_id)
    if not asked:
        return Launch(ok=False, reason="unasked")
    return _launch(conversation_id, user, None, fork_from=fork_from)


def run_edit(*, conversation_id: int, user, message_id: int, text: str) -> Launch:
    """Send an edited version of one of the member's messages: the chat forks there,
    and the old branch stays readable, folded (blocking: call off the loop)."""
    if not text.strip():
        return Launch(ok=False, reason="empty")
    if not editable_message(conversation_id=conversation_id, message_id=message_id):
        return Launch(ok=False, reason="moved")
    return _launch(conversation_id, user, text, fork_from=message_id)


def _launch(
    conversation_id: int, user, text: str | None, *, fork_from: int | None = None
) -> Launch:
    """Start a run here, or (in a process that steps no runs: a WSGI worker, a
    command) hand it to a serving process through the shared channel."""
    rt = runtime()
    if rt.stopping:
        return Launch(ok=False, reason="down")
    serving = rt.serving
    run_id = str(uuid.uuid4())
    try:
        run, first = run_create(
            run_id=run_id,
            conversation_id=conversation_id,
            user=user,
            text=text,
            owner=rt.inbox.name if serving else "",
            fork_from=fork_from,
        )
    except RunBusy:
        return Launch(ok=False, reason="running")
    except Conversation.DoesNotExist:
        return Launch(ok=False, reason="gone")
    except ForkRefused:
        return Launch(ok=False, reason="moved")
    if not serving:
        run_wake([run_id])  # were the message lost, a sweep finds the run
        return Launch(ok=True, run_id=run_id)
    if fork_from is not None:
        # Every tab redraws the chat with the old branch folded (and the edited
        # message) before the run's first fragment, which goes the same way.
        conversation = run.conversation
        for frame in render.transcript_frames(conversation):
            rt.outbox.group(conversation.group_name, {"type": "chat.fragment", "html": frame})
        first = None
    rt.agent_pool.submit(_drive, rt, run_id, launched=(run, first))
    return Launch(ok=True, run_id=run_id)


def run_wake(run_ids) -> None:
    """Step these runs here if they can go on (a call of theirs was decided or ended).

    A process that serves no loop (a WSGI worker, a management command) hands
    them to the serving processes through the shared channel; were that
    message lost, their sweeps find the runs.
    """
    rt = runtime()
    if not rt.serving:
        # The process that stepped a run last holds its python session: it is
        # asked first (every serving process hears the shared channel).
        preferred: dict[str, list[str]] = {}
        for run_id, stepped_by in Run.objects.filter(pk__in=list(run_ids)).values_list(
            "pk", "stepped_by"
        ):
            preferred.setdefault(stepped_by, []).append(str(run_id))
        for prefer, ids in preferred.items():
            message = {"type": "runs.resume", "run_ids": ids, "prefer": prefer}
            rt.outbox.channel(shared_channel(), message)
        return
    table = local_runs(rt)
    for run_id in run_ids:
        run_id = str(run_id)
        if table.queue(run_id):
            rt.agent_pool.submit(_drive, rt, run_id)


def on_calls_settled(sender, *, run_ids, **kwargs) -> None:
    """``approvals.signals.calls_settled``: their runs may go on."""
    run_wake(run_ids)


def run_stop(*, conversation_id: int, user) -> bool:
    """Stop the conversation's run, wherever it is: working in a process, or waiting."""
    run = run_stop_request(conversation_id=conversation_id, user=user)
    if run is None:
        return False
    rt = runtime()
    local = local_runs(rt).get(str(run.pk))
    if local is not None:
        local.cancel.cancel()
    elif run.owner and run.owner != rt.inbox.name:
        # (A lost message: that process's heartbeat reads the row's flag.)
        rt.outbox.channel(run.owner, {"type": "run.cancel", "run_id": str(run.pk)})
    # Nothing the run started outlives Stop: its python session ends too.
    python_sessions_reset(conversation_id=conversation_id)
    return True


def resume_from_message(message: dict) -> None:
    """Inbox handler for ``runs.resume``, handed over by a process that serves no loop.

    The process it prefers claims at once; the others a moment later, and
    only if it did not (it may have exited since).
    """
    run_ids = message.get("run_ids") or []
    prefer = message.get("prefer") or ""
    rt = runtime()
    if prefer and prefer != rt.inbox.name and rt.loop is not None:
        rt.loop.call_later(PREFERRED_FIRST_SECONDS, run_wake, run_ids)
        return
    run_wake(run_ids)


def cancel_from_message(message: dict) -> None:
    """Inbox handler for ``run.cancel`` sent by the process where Stop was pressed."""
    local = local_runs().get(str(message.get("run_id", "")))
    if local is not None:
        local.cancel.cancel()


# --- driving ------------------------------------------------------------------------------


class Start(enum.Enum):
    """How a step starts, which says what it first tells the run's tabs."""

    # This process launched it: the member's message (if any) and Stop.
    LAUNCHED = "launched"
    # Another process created it and handed it over before any step: the
    # tabs redraw the chat with its message (or its fork) in it, and Stop.
    HANDED_OVER = "handed over"
    # Its process exited or died mid-step: "the server restarted", and Stop.
    TAKEN_OVER = "taken over"
    # A decision, a timeout or Stop woke it: the tabs know it already.
    CONTINUED = "continued"

    @classmethod
    def of(cls, claim: Claim) -> Start:
        if claim.started:
            return cls.HANDED_OVER
        return cls.TAKEN_OVER if claim.resumed else cls.CONTINUED


def _drive(rt: Runtime, run_id: str, *, launched: tuple | None = None) -> None:
    """(An agent-pool thread.) Claim the run, step it until it waits or ends, let it go."""
    local_runs(rt).unqueue(run_id)
    close_old_connections()
    owner = rt.inbox.name
    try:
        if rt.stopping:
            if launched is not None:
                runs_abandon(run_ids=[run_id], owner=owner)  # another process starts it
            return
        if launched is not None:
            (run, first), start = launched, Start.LAUNCHED
        else:
            claim = run_claim(run_id=run_id, owner=owner)
            if claim is None:
                return  # someone else steps it, it ended, or it cannot go on yet
            run, first, start = claim.run, None, Start.of(claim)
        ids = {"run_id": run_id, "conversation_id": run.conversation_id}
        with log_context(**ids, user_id=run.started_by_id):
            _step_until_it_waits(rt, run, start, first=first)
    except Exception:
        logger.exception("run %s: driver failed", run_id)
    finally:
        release_connection()


def _step_until_it_waits(
    rt: Runtime, run: Run, start: Start, *, first: Message | None = None
) -> None:
    """Step the claimed run, again while a decision lands as it lets go; then let it go."""
    run_id, owner = str(run.pk), rt.inbox.name
    while True:
        local = LocalRun(run_id=run_id, conversation_id=run.conversation_id, claim=run.claim)
        if run.stop_requested:
            local.cancel.cancel()
        local_runs(rt).begin(local)
        try:
            waiting_on = Stepper(local, run, start, first=first).step()
        finally:
            local_runs(rt).end(run_id)
        if waiting_on is None or not run_release(
            run_id=run_id, owner=owner, waiting_on=waiting_on, claim=run.claim
        ):
            return
        # A decision that landed while this step held the run could not claim
        # it: look once more, now that the run is free (most often the call
        # still waits: one small read).
        if rt.stopping or approval_pending(waiting_on):
            return  # (an exiting process leaves it to the others' sweeps)
        claim = run_claim(run_id=run_id, owner=owner)
        if claim is None:
            return
        run, first, start = claim.run, None, Start.CONTINUED


class Stepper:
    """One step of a run on a worker thread; publishes its events as fragments."""

    def __init__(
        self, local: LocalRun, run: Run, start: Start, *, first: Message | None = None
    ) -> None:
        self.local = local
        self.run = run
        self.start = start
        self.first = first  # the member's message that launched it
        self.agent: Agent | None = None
        self.publisher: Publisher | None = None
        self.status, self.error = Run.Status.DONE, ""

    def step(self) -> str | None:
        """Step until a call waits (returns its approval id) or the run ends (None)."""
        conversation = self.run.conversation
        publisher = self.publisher = Publisher(conversation, self.run)
        if self.start is Start.HANDED_OVER:
            *earlier, last = render.transcript_frames(conversation)
            for frame in earlier:  # a long chat: each part a message of its own
                publisher.send(frame)
                publisher.flush()
            publisher.send(last + render.title(conversation.title))
        elif self.start is Start.LAUNCHED and self.first is not None:
            publisher.send(render.appended(render.message(MessageView.of(self.first))))
            # The first message names the conversation; every open tab shows it.
            publisher.send(render.title(conversation.title))
        elif self.start is Start.TAKEN_OVER:
            publisher.send(render.notice(RESUMED_TEXT, level="info"))
        if self.start is not Start.CONTINUED:
            publisher.send(render.run_controls(running=True, conversation_id=conversation.pk))
            publisher.flush()
        try:
            agent = self.agent = Agent(
                conversation=conversation,
                model=get_model(conversation.model),
                cancel=self.local.cancel,
                user=self.run.started_by,
                run=self.run,
                # MCP servers never reached yet are asked for their tools now,
                # on this worker thread (lazily, and never on a page load).
                toolbox=toolbox_for(conversation, connect=True),
                live=publisher.live_output,
            )
            for event in agent.events():
                if isinstance(event, events.Wait):
                    self._learned()
                    publisher.flush()
                    return event.approval_id
                self._track(event)
                publisher.event(event)
        except Exception as exc:
            logger.exception("run %s failed", self.local.run_id)
            self.status, self.error = Run.Status.ERROR, f"{type(exc).__name__}: {exc}"
            self._report_crash()
        if self.local.cancel.abandoned:
            return None  # the process is exiting; another takes the run on
        self._end()
        return None

    def _track(self, event: events.Event) -> None:
        match event:
            case events.Failed(text=text):
                self.status, self.error = Run.Status.ERROR, text
            case events.Done(cancelled=True):
                self.status = Run.Status.CANCELLED

    def _report_crash(self) -> None:
        try:
            with transaction.atomic():
                # Fenced like every write of a step (see chat.agent).
                run_fence(run_id=self.local.run_id, owner=self.run.owner, claim=self.run.claim)
                message = Message.objects.create(
                    conversation_id=self.local.conversation_id,
                    run_id=self.local.run_id,
                    role=Message.Role.ERROR,
                    content="Something went wrong in Studio while running this. "
                    "The conversation is saved; you can try again.",
                )
                approval_cancel_run(run_id=self.local.run_id)
        except Fenced:
            self.local.cancel.abandon()
            return
        except Exception:
            logger.exception("could not record the failure of run %s", self.local.run_id)
            return
        self.publisher.send(render.appended(render.message(MessageView.of(message))))
        self.publisher.flush()

    def _end(self) -> None:
        if not run_finish(
            run_id=self.local.run_id,
            owner=self.run.owner,
            claim=self.run.claim,
            status=self.status,
            error=self.error,
        ):
            return  # another claim holds the run now: its step tells the tabs
        self.publisher.send(render.run_status(""))
        self.publisher.send(
            render.run_controls(
                running=False,
                conversation_id=self.local.conversation_id,
                retry=self.status == Run.Status.ERROR,
                regenerate=self.status != Run.Status.ERROR,
            )
        )
        self._learned()
        self.publisher.flush()
        if self.status == Run.Status.DONE and self.agent is not None:
            self._name_the_chat()

    def _name_the_chat(self) -> None:
        """After a chat's first reply, its model's short title replaces the first
        message's words (never a member's own name for it)."""
        try:
            title = conversation_title_from_model(
                conversation=self.agent.conversation, model=self.agent.model
            )
        except Exception:
            logger.warning("run %s: no title from the model", self.local.run_id, exc_info=True)
            return
        if title:
            self.publisher.send(render.title(title))
            self.publisher.flush()

    def _learned(self) -> None:
        """The MCP tools this step found for the first time join the panel; the
        files its tools made, or removed, show in the workspace's list."""
        if self.agent is not None and self.agent.toolbox.learned:
            self.publisher.send(render.settings_panel(self.agent.conversation, oob=True))
        elif self.agent is not None and self.agent.ran_tools:
            self.publisher.send(render.files_panel(self.agent.conversation, oob=True))


class Publisher:
    """Renders a run's events into fragments for the conversation's group.

    Fragments are gathered and sent as one channel message at the points
    where the run is about to wait (a status line before a tool or the model
    works, a pending card, the end) or a decided call's result is in, so a
    quick tool costs a few messages, not one per fragment. Content deltas go
    out at most every FLUSH_SECONDS.
    """

    def __init__(self, conversation: Conversation, run: Run) -> None:
        self.group = conversation.group_name
        self.conversation_id = conversation.pk
        # Unique per step: a step resumed elsewhere starts its turns from 0 again.
        self.stream_key = f"{run.pk}-{secrets.token_hex(3)}"
        self.outbox = runtime().outbox
        self.turn = 0
        self.stream_open = False
        self.pending: list[str] = []
        # The batch holds a result the member waits for: deliver it before
        # the run goes on (see Outbox.group's ``wait``).
        self.urgent = False
        self.deltas: list[str] = []
        self.last_flush = 0.0

    @property
    def stream_id(self) -> str:
        return f"stream-{self.stream_key}-{self.turn}"

    def send(self, html: str) -> None:
        """Queue ``html``; it leaves with the next flush."""
        self.pending.append(html)

    def flush(self) -> None:
        """Send what is queued (and the buffered deltas) as one message."""
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
        self.last_flush = time.monotonic()
        self.outbox.group(self.group, {"type": "chat.fragment", "html": html}, wait=self.urgent)
        self.urgent = False

    def live_output(self, message_id: int, call_id: str, text: str) -> None:
        """A running call's latest output, on its card (from the call's own thread,
        which is this step's: the sandbox's watch hands it over)."""
        self.send(render.tool_live(message_id, call_id, text))
        self.flush()

    def event(self, event: events.Event) -> None:
        match event:
            case events.Delta(text=text):
                self.deltas.append(text)
                if time.monotonic() - self.last_flush >= FLUSH_SECONDS:
                    self.flush()
            case events.Status(text=text):
                # Something that may be slow comes next (the model, a tool).
                self.send(render.run_status(text))
                self.flush()
            case events.TurnSaved():
                # Drop the streaming bubble, append the final message (a tab
                # that reconnected mid-stream never had the bubble, and still
                # gets this).
                self.deltas.clear()
                drop = render.stream_drop(self.stream_id) if self.stream_open else ""
                self.send(drop + render.appended(render.turn_saved(event, self.conversation_id)))
                self.turn += 1
                self.stream_open = False
            case events.ToolStarted(awaiting=awaiting, needs_review=needs_review):
                self.send(render.tool_started(event))
                if awaiting:
                    waiting = (
                        "Waiting for a reviewer…" if needs_review else "Waiting for your decision…"
                    )
                    self.send(render.run_status(waiting))
                    self.flush()
            case events.TurnAsked(message_id=message_id, approval_ids=approval_ids):
                self.send(render.batch(message_id, approval_ids))
            case events.ToolFinished(approval_id=approval_id):
                self.send(render.tool_finished(event))
                self.urgent = True
                if approval_id:
                    # Someone decided this call and watches its card: the result
                    # leaves now, not after the next request to the model is built.
                    self.flush()
            case events.Failed(message_id=message_id, text=text, created_at=created_at):
                view = MessageView(message_id, Message.Role.ERROR, text, created_at)
                self.send(render.appended(render.message(view)))
            case events.Done():
                pass


# --- process services (registered with the runtime at start-up) ---------------------------


async def heartbeat(rt: Runtime) -> None:
    """Tell the database this process's working runs are alive (STUDIO_RUN_STALE_SECONDS),
    and hear of a Stop whose message was lost."""
    while True:
        await asyncio.sleep(settings.STUDIO_RUN_HEARTBEAT_SECONDS)
        try:
            await rt.off_loop(heartbeat_once, rt)
        except Exception:
            logger.warning("run heartbeat failed", exc_info=True)
            continue
        if SESSIONS.held():
            try:
                # A Stop or Restart pressed in another process ends this one's session.
                await rt.off_loop(SESSIONS.end_reset)
            except Exception:
                logger.warning("python sessions check failed", exc_info=True)


def heartbeat_once(rt: Runtime) -> None:
    """Mark this process's working runs alive; end the steps of runs another claim
    took over (this process paused past STUDIO_RUN_STALE_SECONDS), stop the
    runs Stop was pressed for."""
    local = local_runs(rt).all()
    beat = run_heartbeat(
        owner=rt.inbox.name, claims={run_id: run.claim for run_id, run in local.items()}
    )
    for run_id in beat.lost:
        logger.warning("run %s was taken over while this process paused; its step ends", run_id)
        local[run_id].cancel.abandon()
    for run_id in beat.stopped:
        local[run_id].cancel.cancel()


async def sweep(rt: Runtime) -> None:
    """Resume what no message resumed: timeouts, runs of processes that exited or
    died, decisions whose resume was lost. Any process may; first claim wins."""
    since, full_at = timezone.now(), float("-inf")
    while True:
        await asyncio.sleep(settings.STUDIO_APPROVAL_POLL_SECONDS)
        if rt.stopping:
            return
        started, now = time.monotonic(), timezone.now()
        full = started - full_at >= FULL_SWEEP_SECONDS
        try:
            run_ids = await rt.off_loop(runs_to_resume, since=None if full else since)
        except Exception:
            logger.warning("run sweep failed", exc_info=True)
            continue
        since = now
        if full:
            full_at = started
        run_wake(run_ids)


def wind_down(rt: Runtime) -> None:
    """The process is exiting: give working steps STUDIO_SHUTDOWN_GRACE_SECONDS to finish,
    then leave the rest for another process. Waiting runs belong to no process."""
    grace = settings.STUDIO_SHUTDOWN_GRACE_SECONDS
    deadline = time.monotonic() + grace
    beat = 0.0
    owner = rt.inbox.name
    table = local_runs(rt)
    while table.all() and time.monotonic() < deadline:
        if time.monotonic() - beat >= 1.0:
            beat = time.monotonic()
            try:
                heartbeat_once(rt)
            except Exception:
                logger.warning("run heartbeat failed while winding down", exc_info=True)
        time.sleep(0.05)
    left = table.all()
    if owner and table.stepped_any:
        try:
            runs_forget_process(owner=owner)
        except Exception:
            logger.warning("could not clear this process from its runs", exc_info=True)
    if not left:
        release_connection()
        return
    for local in left.values():
        local.cancel.abandon()
    try:
        runs_abandon(run_ids=list(left), owner=owner)
    finally:
        release_connection()
    logger.warning(
        "%d run(s) still working after %.0f s; left for another process to resume",
        len(left),
        grace,
    )

"""The driver: claim a run, step it on a worker thread until it waits or ends, let it go.

A step runs the agent (``chat.agent``) from where the rows say the run is;
``Start`` says how it begins, which decides what its tabs are told first.
Its events go out as fragments (``chat.publisher``). A waiting run holds no
thread, no coroutine and no memory anywhere: it is its rows, with no owner.
"""

from __future__ import annotations

import enum
import logging

from django.db import close_old_connections, transaction

from approvals.services.waiting import approval_cancel_run
from chat import display, events
from chat.agent import Agent
from chat.display import MessageView
from chat.llm import get_model
from chat.models import Message, Run
from chat.publisher import Publisher
from chat.runs.local import LocalRun, local_runs
from chat.runs.state import (
    Claim,
    Fenced,
    approval_pending,
    run_claim,
    run_fence,
    run_finish,
    run_release,
    runs_abandon,
)
from chat.services import (
    conversation_title_from_model,
)
from chat.toolbox import toolbox_for
from studio.logs import log_context
from studio.runtime import Runtime, release_connection

logger = logging.getLogger(__name__)

RESUMED_TEXT = "The server restarted; your run continues."


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


def drive(rt: Runtime, run_id: str, *, launched: tuple | None = None) -> None:
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
            (run, first), start, mcp_version = launched, Start.LAUNCHED, None
        else:
            claim = run_claim(run_id=run_id, owner=owner)
            if claim is None:
                return  # someone else steps it, it ended, or it cannot go on yet
            run, first, start, mcp_version = claim.run, None, Start.of(claim), claim.mcp_version
        ids = {"run_id": run_id, "conversation_id": run.conversation_id}
        with log_context(**ids, user_id=run.started_by_id):
            _step_until_it_waits(rt, run, start, first=first, mcp_version=mcp_version)
    except Exception:
        logger.exception("run %s: driver failed", run_id)
    finally:
        release_connection()


def _step_until_it_waits(
    rt: Runtime,
    run: Run,
    start: Start,
    *,
    first: Message | None = None,
    mcp_version: tuple | None = None,
) -> None:
    """Step the claimed run, again while a decision lands as it lets go; then let it go."""
    run_id, owner = str(run.pk), rt.inbox.name
    while True:
        local = LocalRun(run_id=run_id, conversation_id=run.conversation_id, claim=run.claim)
        if run.stop_requested:
            local.cancel.cancel()
        local_runs(rt).begin(local)
        try:
            waiting_on = Stepper(local, run, start, first=first, mcp_version=mcp_version).step()
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
        mcp_version = claim.mcp_version


class Stepper:
    """One step of a run on a worker thread; publishes its events as fragments."""

    def __init__(
        self,
        local: LocalRun,
        run: Run,
        start: Start,
        *,
        first: Message | None = None,
        mcp_version: tuple | None = None,
    ) -> None:
        self.local = local
        self.run = run
        self.start = start
        self.first = first  # the member's message that launched it
        self.mcp_version = mcp_version
        self.agent: Agent | None = None
        self.publisher: Publisher | None = None
        self.status, self.error = Run.Status.DONE, ""

    def step(self) -> str | None:
        """Step until a call waits (returns its approval id) or the run ends (None)."""
        conversation = self.run.conversation
        publisher = self.publisher = Publisher(conversation, self.run)
        if self.start is Start.HANDED_OVER:
            publisher.redrawn(conversation, display.transcript_items(conversation))
        elif self.start is Start.LAUNCHED and self.first is not None:
            publisher.asked(MessageView.of(self.first), conversation.title)
        elif self.start is Start.TAKEN_OVER:
            publisher.notice(RESUMED_TEXT)
        if self.start is not Start.CONTINUED:
            publisher.running()
        try:
            agent = self.agent = Agent(
                conversation=conversation,
                model=get_model(conversation.model),
                cancel=self.local.cancel,
                user=self.run.started_by,
                run=self.run,
                # MCP servers never reached yet are asked for their tools now,
                # on this worker thread (lazily, and never on a page load).
                toolbox=toolbox_for(conversation, connect=True, mcp_version=self.mcp_version),
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
        if self.local.cancel.abandoned and not self._ended_with_answer:
            publisher.flush()  # (what it saved before it gave the run up)
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
        self.publisher.event(events.Failed(message.pk, message.content, message.created_at))
        self.publisher.flush()

    @property
    def _ended_with_answer(self) -> bool:
        """The run's end was recorded in the answer's commit (``Agent._end_with``)."""
        return self.agent is not None and self.agent.ended_run

    def _end(self) -> None:
        if not self._ended_with_answer and not run_finish(
            run_id=self.local.run_id,
            owner=self.run.owner,
            claim=self.run.claim,
            status=self.status,
            error=self.error,
        ):
            return  # another claim holds the run now: its step tells the tabs
        self.publisher.ended(failed=self.status == Run.Status.ERROR)
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
            self.publisher.titled(title)

    def _learned(self) -> None:
        """The MCP tools this step found for the first time join the panel; the
        files its tools made, or removed, show in the workspace's list."""
        if self.agent is not None and self.agent.toolbox.learned:
            self.publisher.settings(display.settings_context(self.agent.conversation))
        elif self.agent is not None and self.agent.ran_tools:
            self.publisher.files(display.files_context(self.agent.conversation))

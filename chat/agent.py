"""The agent loop: model turns, tool calls, every gated call through the gate.

``Agent.events()`` is a plain synchronous generator. The engine steps it on
a worker thread; it yields the run's events (``chat.events``) and writes the
transcript to Message rows as it goes. For each tool call, in this order:

1. not enabled for this request (or unknown)  -> error result, no prompt, no row;
2. the exact call already ran without error    -> "already made" nudge, no prompt;
3. confirmation off, a grant, or admin policy  -> runs without prompt (row recorded);
4. otherwise: the approval row is created and the waiter registered *before*
   ``ToolStarted`` is yielded; then the run yields ``Park`` until a decision,
   and the engine gives the thread back meanwhile.

Closing the generator early (Stop, server shutdown) cancels the run's pending
rows and removes any slot it announced.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from django.conf import settings
from django.db import transaction

from approvals.gate import Slot
from approvals.models import ToolApproval, ToolRule, arguments_hash
from approvals.services.decisions import ApprovalNotFound
from approvals.services.rules import approval_verdict
from approvals.services.waiting import (
    approval_cancel_run,
    approval_check,
    approval_record_auto,
    approval_record_output,
    approval_release,
    approval_request,
    approval_withdraw,
)
from chat import events
from chat.llm.base import ChatModel, LLMError, TextDelta, ToolCall, TurnEnd, new_call_id
from chat.models import Conversation, Message, Run
from chat.toolbox import Toolbox, toolbox_for
from chat.tools.base import ToolResult
from chat.transcript import tool_message, transcript_build, turn_message
from studio.cancel import CancelToken
from studio.text import strip_nul, strip_nul_json
from studio.wording import REJECTION_TEXT

logger = logging.getLogger(__name__)

Reason = ToolApproval.Reason
Action = ToolRule.Action

DUPLICATE_TEXT = (
    "You already made this exact call in this run and it succeeded; its result is "
    "above. Don't repeat it: use that result, or change the arguments if you need "
    "something different."
)
CANCELLED_TEXT = "The run was stopped before this call was decided; it did not run."
EDITED_TEXT = (
    "(The user edited the arguments of this call before it ran; the call above shows what ran.)"
)
BLOCKED_TEXT = "Blocked by a rule: {note}"
TIMEOUT_TEXT = "nobody decided on this call in time, so it did not run."
CHANGED_TEXT = "the approved arguments changed after the request; the call did not run."
LIMIT_TEXT = "the tool-call limit for this run was reached."


def not_enabled_text(name: str, enabled: list[str]) -> str:
    listed = ", ".join(enabled) if enabled else "none"
    return (
        f"tool '{name}' is not enabled for this request. "
        f"Enabled tools: {listed}. Answer without it or ask the user to enable it."
    )


@dataclass(frozen=True)
class _Refused:
    call: ToolCall
    result: ToolResult


@dataclass(frozen=True)
class _Decided:
    """The rules decided without asking (allowed, or blocked)."""

    call: ToolCall
    approval: ToolApproval


@dataclass(frozen=True)
class _Asked:
    call: ToolCall
    approval: ToolApproval
    slot: Slot


_Plan = _Refused | _Decided | _Asked


@dataclass(frozen=True)
class AgentSettings:
    """The knobs of a run; from Django's settings, or a test's own."""

    max_iterations: int
    tool_timeout: float
    approval_timeout: float
    poll: float

    @classmethod
    def from_django(cls, **overrides) -> AgentSettings:
        values = {
            "max_iterations": settings.STUDIO_MAX_TOOL_ITERATIONS,
            "tool_timeout": settings.STUDIO_TOOL_TIMEOUT,
            "approval_timeout": settings.STUDIO_APPROVAL_TIMEOUT,
            "poll": settings.STUDIO_APPROVAL_POLL_SECONDS,
        }
        return cls(**{**values, **overrides})


class Agent:
    def __init__(
        self,
        *,
        conversation: Conversation,
        model: ChatModel,
        cancel: CancelToken,
        run: Run,
        user=None,
        enabled_tools: list[str] | None = None,
        toolbox: Toolbox | None = None,
        knobs: AgentSettings | None = None,
    ) -> None:
        self.conversation = conversation
        self.model = model
        self.cancel = cancel
        self.user = user
        self.run = run
        self.run_id = str(run.pk)
        self.toolbox = toolbox or toolbox_for(conversation, enabled=enabled_tools)
        self.knobs = knobs or AgentSettings.from_django()
        self.workspace = conversation.workspace
        # (tool, argument hash) of calls that ran without error in this run.
        self.succeeded: set[tuple[str, str]] = set()
        self.call_ids: set[str] = set()
        self.turn: Message | None = None
        # Approvals this run asked for and has not seen decided yet.
        self.open_approvals: set[str] = set()
        # What the model is sent: built from the rows once, then kept up to date.
        self.transcript: list[dict] = []

    # -- the loop -----------------------------------------------------------------

    def events(self) -> Iterator[events.Event]:
        try:
            yield from self._loop()
        finally:
            # Runs on normal end, on error and on generator close (Stop, server
            # going away): no slot of this run may outlive it, no row stay pending.
            if self.open_approvals:
                approval_cancel_run(run_id=self.run_id)

    def _loop(self) -> Iterator[events.Event]:
        schemas = self.toolbox.schemas()
        self.transcript = transcript_build(self.conversation, tools=self.toolbox.describe())
        for iteration in itertools.count():
            if self.cancel.is_set():
                yield events.Done(cancelled=True)
                return
            yield events.Status("Thinking…")
            turn = yield from self._model_turn(schemas)
            if turn is None:
                return
            calls = self._save_turn(turn)
            yield events.TurnSaved(
                message_id=self.turn.pk,
                content=self.turn.content,
                created_at=self.turn.created_at,
                calls=tuple(events.CallView(c.id, c.name, c.arguments or {}) for c in calls),
            )
            if not calls:
                yield events.Done()
                return
            if iteration >= self.knobs.max_iterations:
                for call in calls:
                    self._save_result(call, ToolResult.error(LIMIT_TEXT))
                yield from self._fail(
                    f"Stopped: this run reached its limit of {self.knobs.max_iterations} rounds "
                    "of tool calls (STUDIO_MAX_TOOL_ITERATIONS)."
                )
                return
            stop = yield from self._handle_turn(calls)
            if stop:
                yield events.Done(cancelled=True)
                return

    def _model_turn(self, schemas: list[dict]) -> Iterator[events.Event]:
        """Stream one reply; returns its ``TurnEnd``, or None when the run ended."""
        streamed: list[str] = []
        try:
            # A copy: the model may keep what it was sent; we keep appending.
            for chunk in self.model.stream(list(self.transcript), schemas, cancel=self.cancel):
                if isinstance(chunk, TextDelta):
                    text = strip_nul(chunk.text)
                    streamed.append(text)
                    yield events.Delta(text)
                elif isinstance(chunk, TurnEnd):
                    return chunk
        except LLMError as exc:
            self._save_partial("".join(streamed))
            yield from self._fail(str(exc))
            return None
        # The stream ended without a turn: it was cancelled.
        self._save_partial("".join(streamed))
        yield events.Done(cancelled=self.cancel.is_set())
        return None

    # -- the calls of one turn ----------------------------------------------------------

    def _handle_turn(self, calls: list[ToolCall]) -> Iterator[events.Event]:
        """Ask for every call that needs a decision at once, then run them in order.

        All of a turn's cards appear together (and can be decided together);
        a call runs once it and every call before it are decided. Returns True
        when the run must stop.
        """
        plans = []
        for call in calls:
            plan = self._plan(call)
            if isinstance(plan, _Asked):
                yield self._started(call, plan.approval, awaiting=True)
            plans.append(plan)
        asked = tuple(p.approval.approval_id for p in plans if isinstance(p, _Asked))
        if len(asked) > 1:
            yield events.TurnAsked(message_id=self.turn.pk, approval_ids=asked)
        for plan in plans:
            stop = yield from self._carry_out(plan)
            if stop:
                # Calls after a Stop do not run; their cards end as cancelled.
                return True
        return False

    def _plan(self, call: ToolCall) -> _Plan:
        """What happens to ``call``: refused, blocked, run without asking, or asked."""
        refusal = self._refusal(call)
        if refusal is not None:
            return _Refused(call, refusal)
        tool = self.toolbox.tools[call.name]
        subject, reading = tool.reading(call.arguments)
        details = {
            "conversation": self.conversation,
            "tool_name": call.name,
            "arguments": call.arguments,
            "requested_by": self.user,
            "run_id": self.run_id,
            "tool_call_id": call.id,
            "hints": list(tool.hints),
            "schema": tool.parameters,
            "subject": subject,
        }
        verdict = approval_verdict(
            conversation=self.conversation,
            tool_name=call.name,
            subject=subject,
            reading=reading,
        )
        if verdict.action in (Action.ALLOW, Action.DENY):
            return _Decided(call, approval_record_auto(verdict=verdict, **details))
        # Row and slot first, then the announcement: a decision can never
        # arrive before its waiter exists.
        approval, slot = approval_request(verdict=verdict, **details)
        self.open_approvals.add(approval.approval_id)
        return _Asked(call, approval, slot)

    def _carry_out(self, plan: _Plan) -> Iterator[events.Event]:
        call = plan.call
        if isinstance(plan, _Refused):
            yield self._finish(call, plan.result)
            return False
        if isinstance(plan, _Decided):
            yield self._started(call, plan.approval, awaiting=False)
            if plan.approval.is_allowed:
                yield from self._execute(call, plan.approval, cancel=self.cancel)
            else:
                note = (plan.approval.rule_snapshot or {}).get("note") or "no reason given"
                yield self._finish(call, ToolResult(BLOCKED_TEXT.format(note=note), ok=False),
                                   plan.approval)  # fmt: skip
            return False
        if self._already_ran(call):
            # An identical call earlier in this turn succeeded meanwhile.
            approval_withdraw(approval=plan.approval, slot=plan.slot)
            self.open_approvals.discard(plan.approval.approval_id)
            yield self._finish(call, ToolResult(DUPLICATE_TEXT, ok=False), plan.approval)
            return False
        outcome = yield from self._await_decision(plan.slot)
        self.open_approvals.discard(plan.approval.approval_id)
        return (yield from self._follow(call, plan.approval, outcome))

    def _refusal(self, call: ToolCall) -> ToolResult | None:
        """Why ``call`` is answered without running or asking, or None."""
        tool = self.toolbox.get(call.name)
        if tool is None:
            return ToolResult.error(not_enabled_text(call.name or "?", list(self.toolbox.enabled)))
        if call.arguments is None:
            return ToolResult.error(
                f"the arguments of this {call.name} call are not valid JSON: {call.error}"
            )
        problem = tool.validate(call.arguments)
        if problem:
            return ToolResult.error(f"{problem}.")
        if self._already_ran(call):
            return ToolResult(DUPLICATE_TEXT, ok=False)
        return None

    def _already_ran(self, call: ToolCall) -> bool:
        return (call.name, arguments_hash(call.arguments)) in self.succeeded

    def _await_decision(self, slot: Slot) -> Iterator[events.Event]:
        """Park until the row is decided (or ends by Stop or timeout); returns it."""
        deadline = time.monotonic() + self.knobs.approval_timeout
        try:
            while True:
                try:
                    outcome = approval_check(slot=slot, cancel=self.cancel, deadline=deadline)
                except ApprovalNotFound:
                    return None  # deleted meanwhile: treated as cancelled
                if outcome is not None:
                    return outcome
                yield events.Park(slot=slot, deadline=deadline)
        finally:
            approval_release(slot=slot)

    def _follow(
        self, call: ToolCall, approval: ToolApproval, outcome: ToolApproval | None
    ) -> Iterator[events.Event]:
        """Act on a decided call; returns True when the run must stop."""
        if outcome is None or outcome.reason == Reason.CANCELLED:
            yield self._finish(call, ToolResult(CANCELLED_TEXT, ok=False), outcome or approval)
            return True
        if outcome.is_allowed:
            # Allowed first, Stopped after (before the call began): the first
            # decision wins, so the call runs in full, and the run stops after.
            stopped = self.cancel.is_set()
            cancel = CancelToken() if stopped else self.cancel
            yield from self._execute(call, outcome, cancel=cancel)
            return stopped
        if outcome.reason in (Reason.TIMEOUT, Reason.EXPIRED):
            yield self._finish(call, ToolResult.error(TIMEOUT_TEXT), outcome)
            return False
        text = REJECTION_TEXT + (f" The user said: {outcome.note}" if outcome.note else "")
        yield self._finish(call, ToolResult(text, ok=False), outcome)
        return False

    def _execute(
        self, call: ToolCall, approval: ToolApproval, *, cancel: CancelToken
    ) -> Iterator[events.Event]:
        # Run exactly what was approved: the row's arguments (the edited ones
        # if a person edited them), checked against the hash taken then.
        if not approval.arguments_intact():
            yield self._finish(call, ToolResult.error(CHANGED_TEXT), approval)
            return
        arguments = approval.arguments_to_run
        if approval.was_edited:
            self._record_edit(call, arguments)
        yield events.Status(f"Running {call.name}…")
        started = time.monotonic()
        result = self.toolbox.tools[call.name].execute(
            arguments,
            cancel=cancel,
            timeout=self.knobs.tool_timeout,
            workspace=self.workspace,
        )
        seconds = time.monotonic() - started
        if result.ok:
            self.succeeded.add((call.name, arguments_hash(arguments)))
        shown = result
        if approval.was_edited:
            shown = replace(result, text=f"{EDITED_TEXT}\n{result.text}")
        # The audit's output record and the result message: one commit (on
        # PostgreSQL each commit waits for its WAL flush).
        with transaction.atomic():
            approval_record_output(approval=approval, text=result.text, seconds=seconds)
            finished = self._finish(call, shown, approval)
        yield finished

    def _record_edit(self, call: ToolCall, arguments: dict) -> None:
        """The transcript shows the call with the arguments that ran, not the model's."""
        call.arguments = arguments
        tool_calls = [
            {**c, "arguments": arguments} if c["id"] == call.id else c for c in self.turn.tool_calls
        ]
        self.turn.tool_calls = tool_calls
        Message.objects.filter(pk=self.turn.pk).update(tool_calls=tool_calls)
        for entry in reversed(self.transcript):
            if entry["role"] == "assistant":
                entry.update(turn_message(self.turn.content, tool_calls))
                break

    # -- rows and events ------------------------------------------------------------------

    def _save_turn(self, turn: TurnEnd) -> list[ToolCall]:
        calls = turn.tool_calls
        for call in calls:
            # Whatever the model client: no NUL reaches a row (PostgreSQL refuses it).
            call.name = strip_nul(call.name or "")
            if call.arguments is not None:
                call.arguments = strip_nul_json(call.arguments)
            # Some servers number calls per turn ("call_0"); results are
            # matched by id, so an id must not repeat within a run.
            if not call.id or call.id in self.call_ids:
                call.id = new_call_id()
            self.call_ids.add(call.id)
        self.turn = Message.objects.create(
            conversation=self.conversation,
            run=self.run,
            role=Message.Role.ASSISTANT,
            content=strip_nul(turn.content),
            tool_calls=[
                {"id": c.id, "name": c.name, "arguments": c.arguments or {}} for c in calls
            ],
        )
        self.transcript.append(turn_message(self.turn.content, self.turn.tool_calls))
        return calls

    def _started(
        self, call: ToolCall, approval: ToolApproval, *, awaiting: bool
    ) -> events.ToolStarted:
        return events.ToolStarted(
            message_id=self.turn.pk,
            call=events.CallView(call.id, call.name, approval.arguments),
            approval_id=approval.approval_id,
            awaiting=awaiting,
        )

    def _finish(
        self, call: ToolCall, result: ToolResult, approval: ToolApproval | None = None
    ) -> events.ToolFinished:
        message = self._save_result(call, result, approval)
        return events.ToolFinished(
            message_id=self.turn.pk,
            call=events.CallView(call.id, call.name or "", call.arguments or {}),
            result_id=message.pk,
            result=message.content,
            ok=result.ok,
            approval_id=approval.approval_id if approval else "",
            created_at=message.created_at,
            conversation_id=self.conversation.pk,
            images=result.images,
        )

    def _save_result(
        self, call: ToolCall, result: ToolResult, approval: ToolApproval | None = None
    ) -> Message:
        message = Message.objects.create(
            conversation=self.conversation,
            run=self.run,
            role=Message.Role.TOOL,
            content=strip_nul(result.text),
            is_error=not result.ok,
            attachments=list(result.images),
            tool_call_id=call.id,
            tool_name=call.name or "",
            tool_arguments=call.arguments or {},
            approval_id=approval.approval_id if approval else "",
        )
        self.transcript.append(tool_message(call.id, message.content))
        return message

    def _save_partial(self, content: str) -> None:
        if content.strip():
            Message.objects.create(
                conversation=self.conversation,
                run=self.run,
                role=Message.Role.ASSISTANT,
                content=content,
            )

    def _fail(self, text: str) -> Iterator[events.Event]:
        message = Message.objects.create(
            conversation=self.conversation, run=self.run, role=Message.Role.ERROR, content=text
        )
        yield events.Failed(message_id=message.pk, text=text, created_at=message.created_at)

"""The agent loop: model turns, tool calls, every gated call through the gate.

``Agent.events()`` is a synchronous generator run in a worker thread. It
yields ``Event``s (status, content, tool_start, tool_end, done, error) and
writes the transcript to Message rows as it goes. For each tool call, in
this order:

1. not enabled for this request (or unknown)  -> error result, no prompt, no row;
2. the exact call already ran without error    -> "already made" nudge, no prompt;
3. confirmation off, a grant, or admin policy  -> runs without prompt (row recorded);
4. otherwise: the approval row is created and the waiter registered *before*
   ``tool_start`` is yielded; then the run waits for the decision.

Closing the generator early (client gone, Stop) cancels the run's pending
rows and removes any slot it announced.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.conf import settings

from approvals.gate import GATE, Gate
from approvals.models import ToolApproval, arguments_hash
from approvals.services import (
    REJECTION_TEXT,
    approval_auto_reason,
    approval_cancel_run,
    approval_record_auto,
    approval_request,
    approval_wait,
)
from chat.llm.base import ChatModel, LLMError, TextDelta, ToolCall, TurnEnd, new_call_id
from chat.models import Conversation, Message, Run
from chat.tools import REGISTRY
from chat.transcript import transcript_build
from studio.cancel import CancelToken
from studio.text import strip_nul, strip_nul_json

logger = logging.getLogger(__name__)

Reason = ToolApproval.Reason


@dataclass
class Event:
    kind: str  # status | content | tool_start | tool_end | done | error
    data: dict = field(default_factory=dict)


def not_enabled_text(name: str, enabled: list[str]) -> str:
    listed = ", ".join(enabled) if enabled else "none"
    return (
        f"Error: tool '{name}' is not enabled for this request. "
        f"Enabled tools: {listed}. Answer without it or ask the user to enable it."
    )


DUPLICATE_TEXT = (
    "You already made this exact call in this run and it succeeded; its result is "
    "above. Don't repeat it: use that result, or change the arguments if you need "
    "something different."
)
CANCELLED_TEXT = "The run was stopped before this call was decided; it did not run."


class Agent:
    def __init__(
        self,
        *,
        conversation: Conversation,
        model: ChatModel,
        cancel: CancelToken,
        user=None,
        run: Run | None = None,
        enabled_tools: list[str] | None = None,
        max_iterations: int | None = None,
        tool_timeout: float | None = None,
        approval_timeout: float | None = None,
        poll: float | None = None,
        gate: Gate = GATE,
    ) -> None:
        self.conversation = conversation
        self.model = model
        self.cancel = cancel
        self.user = user
        self.run = run
        self.run_id = str(run.pk) if run is not None else ""
        enabled = conversation.enabled_tools if enabled_tools is None else enabled_tools
        self.enabled = [name for name in enabled if name in REGISTRY]
        self.max_iterations = max_iterations or settings.STUDIO_MAX_TOOL_ITERATIONS
        self.tool_timeout = tool_timeout or settings.STUDIO_TOOL_TIMEOUT
        self.approval_timeout = approval_timeout
        self.poll = poll
        self.gate = gate
        self.workspace = settings.STUDIO_WORKSPACE_ROOT / f"conversation-{conversation.pk}"
        # (tool, argument hash) of calls that ran without error in this run.
        self.succeeded: set[tuple[str, str]] = set()
        self.call_ids: set[str] = set()
        self.turn_message: Message | None = None

    def _unique_ids(self, calls: list[ToolCall]) -> list[ToolCall]:
        # Some servers number calls per turn ("call_0"); results are matched
        # by id, so an id must not repeat within a run.
        for call in calls:
            if not call.id or call.id in self.call_ids:
                call.id = new_call_id()
            self.call_ids.add(call.id)
        return calls

    # -- the loop -----------------------------------------------------------------

    def events(self) -> Iterator[Event]:
        try:
            yield from self._loop()
        finally:
            # Runs on normal end, on error and on generator close (Stop, client
            # gone): no slot of this run may outlive it, no row stay pending.
            approval_cancel_run(run_id=self.run_id, gate=self.gate)

    def _loop(self) -> Iterator[Event]:
        schemas = [REGISTRY[name].schema() for name in self.enabled]
        iteration = 0
        while True:
            if self.cancel.is_set():
                yield Event("done", {"cancelled": True})
                return
            yield Event("status", {"text": "Thinking…"})
            messages = transcript_build(self.conversation, enabled_tools=self.enabled)
            turn: TurnEnd | None = None
            streamed = []
            try:
                for chunk in self.model.stream(messages, schemas, cancel=self.cancel):
                    if isinstance(chunk, TextDelta):
                        streamed.append(chunk.text)
                        yield Event("content", {"text": chunk.text})
                    elif isinstance(chunk, TurnEnd):
                        turn = chunk
            except LLMError as exc:
                self._save_partial("".join(streamed))
                yield from self._error(str(exc))
                return
            if turn is None:  # cancelled mid-stream
                self._save_partial("".join(streamed))
                yield Event("done", {"cancelled": self.cancel.is_set()})
                return

            calls = self._unique_ids(turn.tool_calls)
            for c in calls:
                # Whatever the model client: no NUL reaches a row (PostgreSQL refuses it).
                c.name = strip_nul(c.name or "")
                c.arguments = strip_nul_json(c.arguments) if c.arguments is not None else None
            self.turn_message = Message.objects.create(
                conversation=self.conversation,
                run=self.run,
                role=Message.Role.ASSISTANT,
                content=strip_nul(turn.content),
                tool_calls=[
                    {"id": c.id, "name": c.name, "arguments": c.arguments or {}} for c in calls
                ],
            )
            yield Event("message_end", {"content": turn.content, "message": self.turn_message})
            if not calls:
                yield Event("done", {"cancelled": False})
                return
            if iteration >= self.max_iterations:
                for call in calls:
                    self._save_result(call, "Error: the tool-call limit for this run was reached.")
                yield from self._error(
                    f"Stopped: this run reached its limit of {self.max_iterations} rounds of "
                    "tool calls (STUDIO_MAX_TOOL_ITERATIONS)."
                )
                return
            iteration += 1
            for call in calls:
                stopped = yield from self._handle(call)
                if stopped:
                    yield Event("done", {"cancelled": True})
                    return

    def _handle(self, call: ToolCall) -> Iterator[Event]:
        """Process one call; returns True if the run must stop (cancelled)."""
        name, arguments = call.name, call.arguments
        tool = REGISTRY.get(name)
        if tool is None or name not in self.enabled:
            yield from self._finish(call, not_enabled_text(name or "?", self.enabled))
            return False
        if arguments is None:
            text = f"Error: the arguments of this {name} call are not valid JSON: {call.error}"
            yield from self._finish(call, text)
            return False
        problem = tool.validate(arguments)
        if problem:
            yield from self._finish(call, f"Error: {problem}.")
            return False
        key = (name, arguments_hash(arguments))
        if key in self.succeeded:
            yield from self._finish(call, DUPLICATE_TEXT)
            return False

        auto_reason = None
        if not self.conversation.confirm_tool_calls:
            auto_reason = Reason.POLICY
        else:
            auto_reason = approval_auto_reason(conversation=self.conversation, tool_name=name)
        if auto_reason is not None:
            approval = approval_record_auto(
                conversation=self.conversation,
                tool_name=name,
                arguments=arguments,
                reason=auto_reason,
                requested_by=self.user,
                run_id=self.run_id,
                tool_call_id=call.id,
            )
            yield self._tool_start(call, approval, awaiting=False)
            yield from self._execute(call, approval)
            return False

        # Row and slot first, then the announcement: a decision can never
        # arrive before its waiter exists.
        approval, slot = approval_request(
            conversation=self.conversation,
            tool_name=name,
            arguments=arguments,
            requested_by=self.user,
            run_id=self.run_id,
            tool_call_id=call.id,
            gate=self.gate,
        )
        yield self._tool_start(call, approval, awaiting=True)
        outcome = approval_wait(
            slot=slot,
            cancel=self.cancel,
            timeout=self.approval_timeout,
            poll=self.poll,
            gate=self.gate,
        )
        if outcome is None or self.cancel.is_set() or outcome.reason == Reason.CANCELLED:
            yield from self._finish(call, CANCELLED_TEXT, approval=outcome or approval)
            return True
        if outcome.is_allowed:
            yield from self._execute(call, outcome)
        elif outcome.reason in (Reason.TIMEOUT, Reason.EXPIRED):
            text = "Error: nobody decided on this call in time, so it did not run."
            yield from self._finish(call, text, approval=outcome)
        else:
            text = REJECTION_TEXT
            if outcome.note:
                text += f" The user said: {outcome.note}"
            yield from self._finish(call, text, approval=outcome)
        return False

    # -- helpers ---------------------------------------------------------------------

    def _tool_start(self, call: ToolCall, approval: ToolApproval, *, awaiting: bool) -> Event:
        return Event(
            "tool_start",
            {
                "tool": call.name,
                "arguments": approval.arguments,
                "tool_call_id": call.id,
                "approval_id": approval.approval_id,
                "awaiting_confirmation": awaiting,
                "approval": approval,
                "message_id": self.turn_message.pk if self.turn_message else None,
                "name": call.name,
            },
        )

    def _execute(self, call: ToolCall, approval: ToolApproval) -> Iterator[Event]:
        # Run exactly what was approved: the row's arguments, checked against
        # the hash taken when the call was requested.
        if not approval.arguments_intact():
            text = "Error: the approved arguments changed after the request; the call did not run."
            yield from self._finish(call, text, approval=approval)
            return
        yield Event(
            "status", {"text": f"Running {call.name}…", "approval_id": approval.approval_id}
        )
        tool = REGISTRY[call.name]
        result = tool.execute(
            approval.arguments,
            cancel=self.cancel,
            timeout=self.tool_timeout,
            workspace=self.workspace,
        )
        if not result.startswith("Error"):
            self.succeeded.add((call.name, approval.arguments_sha256))
        yield from self._finish(call, result, approval=approval)

    def _finish(self, call: ToolCall, result: str, *, approval: ToolApproval | None = None):
        message = self._save_result(call, result, approval=approval)
        yield Event(
            "tool_end",
            {
                "tool": call.name,
                "tool_call_id": call.id,
                "result": result,
                "approval_id": approval.approval_id if approval else "",
                "approval": approval,
                "message": message,
                "message_id": self.turn_message.pk if self.turn_message else None,
                "arguments": call.arguments or {},
            },
        )

    def _save_result(self, call: ToolCall, result: str, *, approval=None) -> Message:
        return Message.objects.create(
            conversation=self.conversation,
            run=self.run,
            role=Message.Role.TOOL,
            content=strip_nul(result),
            tool_call_id=call.id,
            tool_name=call.name or "",
            tool_arguments=call.arguments or {},
            approval_id=approval.approval_id if approval else "",
        )

    def _save_partial(self, content: str) -> None:
        if content.strip():
            Message.objects.create(
                conversation=self.conversation,
                run=self.run,
                role=Message.Role.ASSISTANT,
                content=content,
            )

    def _error(self, text: str) -> Iterator[Event]:
        message = Message.objects.create(
            conversation=self.conversation,
            run=self.run,
            role=Message.Role.ERROR,
            content=text,
        )
        yield Event("error", {"text": text, "message": message})

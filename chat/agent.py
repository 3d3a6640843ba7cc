"""The agent loop: model turns, tool calls, every gated call through the rules.

``Agent.events()`` is one *step* of a run, a plain synchronous generator. The
engine runs it on a worker thread; it yields the run's events
(``chat.events``) and writes everything to rows as it goes: the transcript
to Message rows, each call to its ToolApproval row. A step starts from where
the rows say the run is, so any process can take the next one. For each
tool call, in this order:

1. not enabled for this request (or unknown)  -> error result, no prompt, no row;
2. the exact call already ran without error    -> "already made" nudge, no prompt;
3. confirmation off, a rule, or admin policy   -> runs (or is blocked) without a prompt;
4. otherwise: the pending row is written *before* ``ToolStarted`` is yielded;
   the step yields ``Wait`` and ends. The run is then only rows until a
   decision, a timeout or Stop lets a process step it again.

An allowed call is marked started before it runs: one found started without
a result (the process died meanwhile) is reported as interrupted, never run
again.

Every write of a step is *fenced* (``_fenced``): in its transaction it first
holds the run's row for the step's claim (``chat.runs.state.run_fence``), or
its first statement is a conditional update that tests the claim itself (a
tool's start and result, the final answer with the run's end). A
step whose process paused while another took the run over writes nothing
more and ends; after Stop (a row change) a step starts nothing new: no
model turn, no card, no tool.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from operator import attrgetter

from django.conf import settings
from django.db import transaction
from django.db.models import Exists
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule, arguments_hash
from approvals.services.rules import approval_verdict
from approvals.services.waiting import (
    approval_cancel_run,
    approval_record_auto,
    approval_record_interrupted,
    approval_record_output,
    approval_request,
    approval_start,
    approvals_end,
)
from chat import events
from chat.llm.base import ChatModel, LLMError, TextDelta, ToolCall, TurnEnd, new_call_id
from chat.models import Conversation, Message, Run
from chat.runs.state import Fenced, run_fence, run_finish, run_held
from chat.toolbox import Toolbox, toolbox_for
from chat.tools.base import ToolResult
from chat.transcript import tool_message, transcript_build, turn_message
from studio.cancel import CancelToken
from studio.metrics import MODEL_REQUEST_SECONDS, MODEL_TOKENS, TOOL_CALL_SECONDS
from studio.runtime import release_connection
from studio.text import strip_nul, strip_nul_json
from studio.wording import EDITED_TEXT, REJECTION_TEXT

logger = logging.getLogger(__name__)

Reason = ToolApproval.Reason
Action = ToolRule.Action

DUPLICATE_TEXT = (
    "You already made this exact call in this run and it succeeded; its result is "
    "above. Don't repeat it: use that result, or change the arguments if you need "
    "something different."
)
CANCELLED_TEXT = "The run was stopped before this call was decided; it did not run."
STOPPED_TEXT = "The run was stopped before this call began; it did not run."
BLOCKED_TEXT = "Blocked by a rule: {note}"
TIMEOUT_TEXT = "nobody decided on this call in time, so it did not run."
CHANGED_TEXT = "the approved arguments changed after the request; the call did not run."
LIMIT_TEXT = "the tool-call limit for this run was reached."
INTERRUPTED_TEXT = (
    "interrupted: the server stopped while this ran; it may have partly run. It was not run again."
)

# What a turn's calls came to: the run waits for a decision, or must stop.
WAIT, STOP = "wait", "stop"


class Abandoned(Exception):
    """The step gave the run up (its process exits, or another claim took the run
    over): write nothing more (another process steps it)."""


class _Stopped(Exception):
    """Stop was pressed: the step starts nothing new and the run ends."""


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
    """Asked now, or earlier (a step resumed): decided or not."""

    call: ToolCall
    approval: ToolApproval


_Plan = _Refused | _Decided | _Asked


@dataclass(frozen=True)
class AgentSettings:
    """The knobs of a run; from Django's settings, or a test's own."""

    max_iterations: int
    tool_timeout: float
    approval_timeout: float

    @classmethod
    def from_django(cls, **overrides) -> AgentSettings:
        values = {
            "max_iterations": settings.STUDIO_MAX_TOOL_ITERATIONS,
            "tool_timeout": settings.STUDIO_TOOL_TIMEOUT,
            "approval_timeout": settings.STUDIO_APPROVAL_TIMEOUT,
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
        live: Callable[[int, str, str], None] | None = None,
    ) -> None:
        self.conversation = conversation
        # Hears a running call's latest output: (its turn's message id, call id, text).
        self.live = live
        self.model = model
        self.cancel = cancel
        self.user = user
        self.run = run
        self.run_id = str(run.pk)
        self.toolbox = toolbox or toolbox_for(conversation, enabled=enabled_tools)
        self.knobs = knobs or AgentSettings.from_django()
        self.workspace = conversation.workspace
        self.ran_tools = False  # a tool ran in this step: its workspace may have changed
        # Read from the run's rows when a step starts (``_load``):
        # (tool, argument hash) of calls that ran without error in this run,
        self.succeeded: set[tuple[str, str]] = set()
        # the call ids used in it, its model turns that asked for tools,
        self.call_ids: set[str] = set()
        self.rounds = 0
        # its last model turn, and the ids of that turn's calls with a result.
        self.turn: Message | None = None
        self.answered: set[str] = set()
        self.finished = False
        # What the model is sent: built from the rows, then kept up to date.
        self.transcript: list[dict] = []
        self._fencing = False  # inside a fenced write (nested writes share it)
        # The run ended with the model's final answer: no call of it can be pending.
        self.answered_all = False
        # This step recorded the run's end with that answer (``_end_with``).
        self.ended_run = False

    # -- the step -------------------------------------------------------------------

    def events(self) -> Iterator[events.Event]:
        """One step: from where the rows say the run is, until it waits (``Wait``) or ends."""
        ended = False
        try:
            ended = yield from self._step()
        except Abandoned:
            return
        except _Stopped:
            ended = True
            yield events.Done(cancelled=True)
        finally:
            # A run that ended leaves no call pending (calls after a Stop). One
            # that ended with the model's answer has none: every call of every
            # turn was answered before the model was asked again.
            if ended and not self.cancel.abandoned and not self.answered_all:
                with contextlib.suppress(Abandoned), self._fenced():
                    approval_cancel_run(run_id=self.run_id)

    def _step(self) -> Iterator[events.Event]:
        """Returns True when the run ended, False when it waits."""
        self._load()
        if self.finished:
            yield events.Done()
            return True
        calls = self._open_calls()
        if calls:
            outcome = yield from self._handle_turn(calls, resumed=True)
            if outcome == WAIT:
                return False
            if outcome == STOP:
                yield events.Done(cancelled=True)
                return True
        return (yield from self._loop())

    def _load(self) -> None:
        """Where the run is, from its rows: its turns, the calls answered, what succeeded."""
        last_turn = last_role = None
        for message in Message.objects.filter(run_id=self.run_id).order_by("created_at", "id"):
            last_role = message.role
            if message.role == Message.Role.ASSISTANT:
                last_turn = message
                self.call_ids.update(c["id"] for c in message.tool_calls)
                self.rounds += bool(message.tool_calls)
            elif message.role == Message.Role.TOOL:
                self.answered.add(message.tool_call_id)
                if not message.is_error:
                    self.succeeded.add((message.tool_name, arguments_hash(message.tool_arguments)))
        # A final answer or an error message was the run's last word.
        self.finished = last_role == Message.Role.ERROR or (
            last_role == Message.Role.ASSISTANT and not last_turn.tool_calls
        )
        if last_turn is not None and any(
            c["id"] not in self.answered for c in last_turn.tool_calls
        ):
            self.turn = last_turn

    def _open_calls(self) -> list[ToolCall]:
        """The calls of the turn in hand still without a result, in the model's order."""
        if self.turn is None:
            return []
        return [
            ToolCall(
                c["id"],
                c["name"],
                None if c.get("error") else c.get("arguments") or {},
                c.get("error", ""),
            )
            for c in self.turn.tool_calls
            if c["id"] not in self.answered
        ]

    def _loop(self) -> Iterator[events.Event]:
        schemas = self.toolbox.schemas()
        built = False
        while True:
            if self.cancel.is_set():
                self._guard()
                yield events.Done(cancelled=True)
                return True
            yield events.Status("Thinking…")
            if not built:
                # Read once "Thinking…" went out, and a decided call's result
                # with it: the tab need not wait for it.
                self.transcript = transcript_build(self.conversation, tools=self.toolbox.describe())
                built = True
            turn = yield from self._model_turn(schemas)
            if turn is None:
                return True
            calls = self._save_turn(turn)
            yield events.TurnSaved(
                message_id=self.turn.pk,
                content=self.turn.content,
                created_at=self.turn.created_at,
                model_name=self.turn.model_name,
                calls=tuple(events.CallView(c.id, c.name, c.arguments or {}) for c in calls),
            )
            if not calls:
                self.answered_all = True
                yield events.Done()
                return True
            if self.rounds >= self.knobs.max_iterations:
                for call in calls:
                    self._save_result(call, ToolResult.error(LIMIT_TEXT))
                yield from self._fail(
                    f"Stopped: this run reached its limit of {self.knobs.max_iterations} rounds "
                    "of tool calls (STUDIO_MAX_TOOL_ITERATIONS)."
                )
                return True
            self.rounds += 1
            outcome = yield from self._handle_turn(calls)
            if outcome == WAIT:
                return False
            if outcome == STOP:
                yield events.Done(cancelled=True)
                return True

    def _model_turn(self, schemas: list[dict]) -> Iterator[events.Event]:
        """Stream one reply; returns its ``TurnEnd``, or None when the run ended."""
        streamed: list[str] = []
        started = time.monotonic()
        # A reply may take minutes: no pooled connection waits on it with the
        # run (the next write takes one back).
        release_connection()
        try:
            # A copy: the model may keep what it was sent; we keep appending.
            for chunk in self.model.stream(list(self.transcript), schemas, cancel=self.cancel):
                if isinstance(chunk, TextDelta):
                    text = strip_nul(chunk.text)
                    streamed.append(text)
                    yield events.Delta(text)
                elif isinstance(chunk, TurnEnd):
                    MODEL_REQUEST_SECONDS.labels("ok").observe(time.monotonic() - started)
                    for kind, count in (chunk.usage or {}).items():
                        MODEL_TOKENS.labels(kind).inc(count)
                    return chunk
        except LLMError as exc:
            MODEL_REQUEST_SECONDS.labels("error").observe(time.monotonic() - started)
            self._save_partial("".join(streamed))
            yield from self._fail(str(exc))
            return None
        # The stream ended without a turn: it was cancelled.
        self._save_partial("".join(streamed))
        yield events.Done(cancelled=self.cancel.is_set())
        return None

    # -- the calls of one turn ----------------------------------------------------------

    def _handle_turn(self, calls: list[ToolCall], *, resumed: bool = False):
        """Ask for every call that needs a decision at once, then carry them out in order.

        All of a turn's cards appear together (and can be decided together);
        a call runs once it and every call before it are decided. Returns
        WAIT when a call waits for a decision, STOP when the run must stop.
        """
        rows = {}
        if resumed:
            # Unordered and without a join: each row's conversation is this run's.
            asked_before = ToolApproval.objects.filter(
                run_id=self.run_id, tool_call_id__in=[c.id for c in calls]
            ).order_by()
            for approval in sorted(asked_before, key=attrgetter("pk"), reverse=True):
                approval.conversation = self.conversation
                rows[approval.tool_call_id] = approval  # the first asked, if ever two
        plans = []
        for call in calls:
            row = rows.get(call.id)
            plan = self._plan(call) if row is None else _Asked(call, row)
            if isinstance(plan, _Asked) and row is None:
                yield self._started(call, plan.approval, awaiting=True)
            plans.append(plan)
        asked = tuple(
            p.approval.approval_id for p in plans if isinstance(p, _Asked) and p.approval.is_pending
        )
        if len(asked) > 1 and not resumed:
            yield events.TurnAsked(message_id=self.turn.pk, approval_ids=asked)
        for plan in plans:
            outcome = yield from self._carry_out(plan)
            if outcome is not None:
                # Calls after a Stop do not run; their cards end as cancelled.
                return outcome
        return None

    def _plan(self, call: ToolCall) -> _Plan:
        """What happens to ``call``: refused, blocked, run without asking, or asked."""
        refusal = self._refusal(call)
        if refusal is not None:
            return _Refused(call, refusal)
        self._guard()
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
            with self._fenced(going_on=True):
                return _Decided(call, approval_record_auto(verdict=verdict, **details))
        # The row first, then the announcement: a decision always finds its row.
        with self._fenced(going_on=True):
            approval = approval_request(
                verdict=verdict, timeout=self.knobs.approval_timeout, **details
            )
        return _Asked(call, approval)

    def _carry_out(self, plan: _Plan) -> Iterator[events.Event]:
        call = plan.call
        if isinstance(plan, _Refused):
            yield self._finish(call, plan.result)
            return None
        if isinstance(plan, _Decided):
            yield self._started(call, plan.approval, awaiting=False)
            return (yield from self._follow(call, plan.approval))
        approval = plan.approval
        if approval.is_pending:
            if self._already_ran(call):
                # An identical call earlier in this turn succeeded meanwhile.
                with self._fenced():
                    approvals_end(
                        pending=ToolApproval.objects.filter(pk=approval.pk),
                        reason=Reason.CANCELLED,
                    )
                    finished = self._finish(call, ToolResult(DUPLICATE_TEXT, ok=False), approval)
                yield finished
                return None
            approval = self._settle(approval)
            if approval.is_pending:
                yield events.Wait(approval.approval_id)
                return WAIT
        return (yield from self._follow(call, approval))

    def _settle(self, approval: ToolApproval) -> ToolApproval:
        """End a pending call now if Stop was pressed or its time is up; the row as it is."""
        if self.cancel.is_set():
            reason = Reason.CANCELLED
        elif approval.expires_at is not None and approval.expires_at <= timezone.now():
            reason = Reason.TIMEOUT
        else:
            return approval
        with self._fenced():
            ended = approvals_end(
                pending=ToolApproval.objects.filter(pk=approval.pk), reason=reason
            )
        if ended:
            return ended[0]
        # A decision won the race against it.
        return ToolApproval.objects.select_related("conversation").get(pk=approval.pk)

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

    def _follow(self, call: ToolCall, outcome: ToolApproval) -> Iterator[events.Event]:
        """Act on a decided call; returns STOP when the run must stop."""
        if outcome.reason == Reason.CANCELLED:
            yield self._finish(call, ToolResult(CANCELLED_TEXT, ok=False), outcome)
            return STOP
        if outcome.is_allowed:
            # Stop pressed before the call began (even after its Allow): it does
            # not begin. Pressed while it runs: it is stopped, and so is the run.
            began = yield from self._execute(call, outcome)
            return STOP if not began or self.cancel.is_set() else None
        if outcome.reason in (Reason.TIMEOUT, Reason.EXPIRED):
            yield self._finish(call, ToolResult.error(TIMEOUT_TEXT), outcome)
            return None
        if outcome.reason == Reason.RULE:
            note = (outcome.rule_snapshot or {}).get("note") or "no reason given"
            yield self._finish(call, ToolResult(BLOCKED_TEXT.format(note=note), ok=False), outcome)
            return None
        text = REJECTION_TEXT + (f" The user said: {outcome.note}" if outcome.note else "")
        yield self._finish(call, ToolResult(text, ok=False), outcome)
        return None

    def _execute(self, call: ToolCall, approval: ToolApproval) -> Iterator[events.Event]:
        """Run an allowed call; returns False when Stop came before it began."""
        # Run exactly what was approved: the row's arguments (the edited ones
        # if a person edited them), checked against the hash taken then.
        if not approval.arguments_intact():
            yield self._finish(call, ToolResult.error(CHANGED_TEXT), approval)
            return True
        try:
            # The tool starts only once its start is committed under the claim:
            # one conditional update that checks the claim (and Stop) as it
            # marks the start; when it marks nothing, the fenced path says why
            # (Stop, a takeover, or begun before).
            self._guard()
            began = not self.cancel.is_set() and approval_start(
                approval=approval, only_if=self._claim_holds()
            )
            if not began:
                with self._fenced(going_on=True):
                    began = approval_start(approval=approval)
        except _Stopped:
            yield self._finish(call, ToolResult(STOPPED_TEXT, ok=False), approval)
            return False
        if not began:
            # Begun before, by a process that stopped before its result was saved
            # (or was saving it as this step took the run over: then it is kept).
            with self._fenced():
                finished = None
                if not approval_record_interrupted(approval=approval):
                    finished = self._saved_before(call, approval)
                if finished is None:
                    finished = self._finish(call, ToolResult.error(INTERRUPTED_TEXT), approval)
            yield finished
            return True
        arguments = approval.arguments_to_run
        if approval.was_edited:
            self._record_edit(call, arguments)
        yield events.Status(f"Running {call.name}…")
        started = time.monotonic()
        self.ran_tools = True
        release_connection()  # (as for the model: a tool may take minutes)
        progress = None
        if self.live is not None:
            progress = functools.partial(self.live, self.turn.pk, call.id)
        result = self.toolbox.tools[call.name].execute(
            arguments,
            cancel=self.cancel,
            timeout=self.knobs.tool_timeout,
            workspace=self.workspace,
            fresh=approval.fresh_interpreter,
            progress=progress,
        )
        seconds = time.monotonic() - started
        TOOL_CALL_SECONDS.labels(call.name, "ok" if result.ok else "error").observe(seconds)
        if result.ok:
            self.succeeded.add((call.name, arguments_hash(arguments)))
        shown = result
        if approval.was_edited:
            shown = replace(result, text=f"{EDITED_TEXT}\n{result.text}")
        # The audit's output record and the result message: one commit (on
        # PostgreSQL each commit waits for its WAL flush), fenced by the
        # record's own update.
        Outcome = ToolApproval.RunOutcome
        outcome = Outcome.STOPPED if result.stopped else Outcome.OK if result.ok else Outcome.FAILED
        record = functools.partial(
            approval_record_output,
            approval=approval,
            text=result.text,
            seconds=seconds,
            outcome=outcome,
            session=result.session,
        )
        with self._fenced(first=record):
            finished = self._finish(call, shown, approval)
        yield finished
        return True

    def _record_edit(self, call: ToolCall, arguments: dict) -> None:
        """The transcript shows the call with the arguments that ran, not the model's."""
        call.arguments = arguments
        tool_calls = [
            {**c, "arguments": arguments} if c["id"] == call.id else c for c in self.turn.tool_calls
        ]
        self.turn.tool_calls = tool_calls
        with self._fenced():
            Message.objects.filter(pk=self.turn.pk).update(tool_calls=tool_calls)
        for entry in reversed(self.transcript):
            if entry["role"] == "assistant":
                entry.update(turn_message(self.turn.content, tool_calls))
                break

    # -- rows and events ------------------------------------------------------------------

    def _guard(self) -> None:
        """A run given up by this step (see ``Abandoned``) writes nothing more."""
        if self.cancel.abandoned:
            raise Abandoned(self.run_id)

    def _claim_holds(self, *, unless_stopped: bool = True) -> Exists:
        """True in a statement while this step's claim holds the run (and, with
        ``unless_stopped``, Stop was not pressed): ``run_fence``'s test, for a
        write whose first statement is one conditional update.

        It takes no lock: a takeover committing just after may find the write
        done, as it finds a call begun by a process that then died; a write the
        takeover would also make (a call's outcome) is ordered by its own row.
        """
        held = run_held(run_id=self.run_id, owner=self.run.owner, claim=self.run.claim)
        return Exists(held.filter(stop_requested=False) if unless_stopped else held)

    @contextlib.contextmanager
    def _fenced(self, *, going_on: bool = False, first: Callable[..., bool] | None = None):
        """A write of this step: it commits only while the step's claim holds the run.

        Fenced out, the step gives the run up (``Abandoned``); ``going_on``
        (a write that makes the run go on) after Stop raises ``_Stopped``.
        ``first``: the write's first statement, a conditional update taking the
        claim's test as ``only_if``; when it marks its row the claim held and
        the run's row is not locked; when not, ``run_fence`` says why.
        """
        self._guard()
        if self._fencing:  # a write within a fenced one: the same transaction
            if first is not None:
                first()
            yield
            return
        with transaction.atomic():
            if first is None or not first(only_if=self._claim_holds(unless_stopped=False)):
                self._fence(going_on=going_on)
            self._fencing = True
            try:
                yield
            finally:
                self._fencing = False

    def _fence(self, *, going_on: bool) -> None:
        """Hold the run's row for this step's claim (``run_fence``), or give the run up."""
        try:
            goes_on = run_fence(run_id=self.run_id, owner=self.run.owner, claim=self.run.claim)
        except Fenced:
            logger.warning("run %s: taken over elsewhere; this step writes no more", self.run_id)
            self.cancel.abandon()
            raise Abandoned(self.run_id) from None
        if going_on and (not goes_on or self.cancel.is_set()):
            self.cancel.cancel()
            raise _Stopped(self.run_id)

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
        fields = {
            "conversation": self.conversation,
            "run": self.run,
            "role": Message.Role.ASSISTANT,
            "content": strip_nul(turn.content),
            "tool_calls": [_call_entry(c) for c in calls],
            "model_name": self.model.label[:60],
        }
        if not calls and self._end_with(fields):
            return calls
        with self._fenced(going_on=True):
            self.turn = Message.objects.create(**fields)
        self.transcript.append(turn_message(self.turn.content, self.turn.tool_calls))
        return calls

    def _end_with(self, fields: dict) -> bool:
        """The model's final answer and the run's end in one commit; False when the
        run cannot end here (Stop, or another claim): the fenced path says which.

        The end is the conditional update that fences every write (claim, owner,
        no Stop), so it holds the run's row for the answer as ``run_fence`` would.
        """
        self._guard()
        if self.cancel.is_set():
            return False
        with transaction.atomic():
            ended = run_finish(
                run_id=self.run_id,
                owner=self.run.owner,
                claim=self.run.claim,
                status=Run.Status.DONE,
                unless_stopped=True,
            )
            if ended:
                self.turn = Message.objects.create(**fields)
        if ended:
            self.ended_run = True
            self.transcript.append(turn_message(self.turn.content, self.turn.tool_calls))
        return ended

    def _started(
        self, call: ToolCall, approval: ToolApproval, *, awaiting: bool
    ) -> events.ToolStarted:
        return events.ToolStarted(
            message_id=self.turn.pk,
            call=events.CallView(call.id, call.name, approval.arguments),
            approval_id=approval.approval_id,
            awaiting=awaiting,
            needs_review=approval.needs_review,
        )

    def _finish(
        self, call: ToolCall, result: ToolResult, approval: ToolApproval | None = None
    ) -> events.ToolFinished:
        return self._finished(call, self._save_result(call, result, approval), approval)

    def _finished(
        self, call: ToolCall, message: Message, approval: ToolApproval | None
    ) -> events.ToolFinished:
        return events.ToolFinished(
            message_id=self.turn.pk,
            call=events.CallView(call.id, call.name or "", call.arguments or {}),
            result_id=message.pk,
            result=message.content,
            ok=not message.is_error,
            approval_id=approval.approval_id if approval else "",
            created_at=message.created_at,
            conversation_id=self.conversation.pk,
            images=tuple(message.attachments),
            stopped_by=message.stopped_by,
        )

    def _saved_before(self, call: ToolCall, approval: ToolApproval) -> events.ToolFinished | None:
        """The result another step saved for ``call`` after this one read the run."""
        message = Message.objects.filter(
            run_id=self.run_id, role=Message.Role.TOOL, tool_call_id=call.id
        ).first()
        if message is None:
            return None
        if not message.is_error:
            self.succeeded.add((call.name, arguments_hash(message.tool_arguments)))
        self.transcript.append(tool_message(call.id, message.content))
        return self._finished(call, message, approval)

    def _save_result(
        self, call: ToolCall, result: ToolResult, approval: ToolApproval | None = None
    ) -> Message:
        with self._fenced():
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
                # Stop is pressed by the conversation's owner, who started the run.
                stopped_by=(self.user.get_username() if self.user else "member")
                if result.stopped
                else "",
            )
        self.transcript.append(tool_message(call.id, message.content))
        return message

    def _save_partial(self, content: str) -> None:
        self._guard()  # (a step given up ends here, whether or not a reply began)
        if content.strip():
            with self._fenced():
                Message.objects.create(
                    conversation=self.conversation,
                    run=self.run,
                    role=Message.Role.ASSISTANT,
                    content=content,
                    model_name=self.model.label[:60],
                )

    def _fail(self, text: str) -> Iterator[events.Event]:
        with self._fenced():
            message = Message.objects.create(
                conversation=self.conversation, run=self.run, role=Message.Role.ERROR, content=text
            )
        yield events.Failed(message_id=message.pk, text=text, created_at=message.created_at)


def _call_entry(call: ToolCall) -> dict:
    """A call as its turn's row keeps it (with why its arguments could not be read)."""
    entry = {"id": call.id, "name": call.name, "arguments": call.arguments or {}}
    if call.arguments is None:
        entry["error"] = call.error or "unreadable"
    return entry

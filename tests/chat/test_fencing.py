"""A step's writes are fenced by its claim on the run (issue 54).

An owner that pauses (a long GC pause, swapping, a frozen VM) past
STUDIO_RUN_STALE_SECONDS loses its run to another process. When it comes
back it must write nothing more: no model turn, no card, no tool result,
no tool started; and after Stop (a row change) no step starts anything new.
The pause is played here inside the step itself (the model's reply or the
tool is where the owner "was" while the other process took over); the same
with real processes and SIGSTOP is in tests/faults/test_fencing_processes.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from chat.agent import INTERRUPTED_TEXT, Agent, AgentSettings
from chat.events import Done, ToolFinished, ToolStarted, Wait
from chat.models import Message, Run
from chat.runs.state import Fenced, run_claim, run_fence, run_heartbeat
from chat.services import run_create
from chat.toolbox import Toolbox
from chat.tools.base import Tool, ToolResult
from studio.cancel import CancelToken
from tests.helpers.scripted import ScriptedModel, call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]

BOUND = 10.0


def owned_run(conversation, user, owner: str = "process-a") -> Run:
    run, _ = run_create(
        run_id=str(uuid.uuid4()),
        conversation_id=conversation.pk,
        user=user,
        text="go",
        owner=owner,
    )
    return Run.objects.get(pk=run.pk)


def take_over(run: Run, owner: str = "process-b") -> Run:
    """Another process finds ``run``'s owner stale and claims it."""
    stale = timezone.now() - timedelta(seconds=3600)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=stale)
    claim = run_claim(run_id=str(run.pk), owner=owner)
    assert claim is not None and claim.resumed
    return claim.run


def agent(conversation, run: Run, model, **extra) -> Agent:
    return Agent(
        conversation=conversation,
        model=model,
        cancel=CancelToken(),
        user=conversation.owner,
        run=run,
        knobs=AgentSettings.from_django(),
        **extra,
    )


def counting_tool(ran: list, *, during=None) -> Toolbox:
    def count(arguments, **_):
        ran.append(arguments)
        if during is not None:
            during()
        return ToolResult("counted")

    tool = Tool(name="count", description="Count.", parameters={"type": "object"}, run=count)
    return Toolbox(tools={"count": tool}, enabled=("count",))


def test_a_step_taken_over_during_its_model_call_writes_no_turn(conversation, alice):
    conversation.confirm_tool_calls = False
    conversation.save()
    run = owned_run(conversation, alice)
    ran: list = []

    def reply_after_a_takeover(messages):
        take_over(run)  # the owner "paused" while it waited for this reply
        return "", [call("count", {"n": 1})]

    old = agent(
        conversation, run, ScriptedModel([reply_after_a_takeover]), toolbox=counting_tool(ran)
    )
    seen = list(old.events())
    assert old.cancel.abandoned  # the step gave the run up
    assert not any(isinstance(e, (ToolStarted, ToolFinished, Done)) for e in seen)
    assert not Message.objects.filter(run=run, role="assistant").exists()
    assert not ToolApproval.objects.filter(run_id=str(run.pk)).exists()
    assert ran == []
    assert Run.objects.get(pk=run.pk).owner == "process-b"  # nothing of the old step's


def test_a_tool_running_when_its_step_was_taken_over_gets_one_result(conversation, alice):
    """The new owner reports the call interrupted; the old owner's result is fenced out."""
    conversation.confirm_tool_calls = False
    conversation.save()
    run = owned_run(conversation, alice)
    ran: list = []
    taken: list[Run] = []
    old = agent(
        conversation,
        run,
        ScriptedModel([("", [call("count", {"n": 1}, "c1")])]),
        toolbox=counting_tool(ran, during=lambda: taken.append(take_over(run))),
    )
    seen = list(old.events())
    assert ran == [{"n": 1}] and old.cancel.abandoned
    assert not any(isinstance(e, ToolFinished) for e in seen)
    # The new owner's step: the call began and has no result, so it is interrupted.
    new = agent(
        conversation,
        taken[0],
        ScriptedModel([("Sorry, it was interrupted.", [])]),
        toolbox=counting_tool(ran),
    )
    finished = [e for e in new.events() if isinstance(e, ToolFinished)]
    assert [f.result for f in finished] == ["Error: " + INTERRUPTED_TEXT]
    assert ran == [{"n": 1}]  # it ran once, and was never run again
    results = Message.objects.filter(run=run, role="tool", tool_call_id="c1")
    assert results.count() == 1


def test_a_result_committing_as_its_run_is_taken_over_is_kept(conversation, alice):
    """The old owner's result is fenced by its audit row's own update, not the run's
    lock: a takeover arriving between that update and its commit waits on the
    row (PostgreSQL; SQLite: one writer at a time) and then finds the result,
    instead of reporting the call interrupted beside it."""
    conversation.confirm_tool_calls = False
    conversation.save()
    run = owned_run(conversation, alice)
    ran: list = []
    recorded, release = threading.Event(), threading.Event()
    seen: dict = {}

    def pause_after_the_record(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith('UPDATE "approvals_toolapproval" SET "run_outcome"'):
            recorded.set()
            assert release.wait(BOUND)
        return result

    def answer_once_taken_over(messages):
        deadline = time.monotonic() + BOUND
        while Run.objects.get(pk=run.pk).claim == run.claim and time.monotonic() < deadline:
            time.sleep(0.02)
        return "Done too.", []

    def old_owner() -> None:
        try:
            model = ScriptedModel([("", [call("count", {"n": 1}, "c1")]), answer_once_taken_over])
            step = agent(conversation, run, model, toolbox=counting_tool(ran))
            with connection.execute_wrapper(pause_after_the_record):
                # Its answer is fenced out: the run is the new owner's.
                seen["old"] = [e for e in step.events() if isinstance(e, ToolFinished)]
        finally:
            connections.close_all()

    def new_owner() -> None:
        try:
            taken = take_over(run)
            step = agent(
                conversation, taken, ScriptedModel([("Done.", [])]), toolbox=counting_tool(ran)
            )
            seen["new"] = [e for e in step.events() if isinstance(e, ToolFinished)]
        except Exception as exc:
            seen["new"] = exc
        finally:
            connections.close_all()

    old, new = _second_waits_on_first(
        old_owner, recorded, new_owner, statement='UPDATE "approvals_toolapproval"'
    )
    if connection.vendor != "postgresql":
        new.join(0.3)  # (its claim waits for the one writer)
    assert new.is_alive()
    release.set()
    old.join(BOUND)
    new.join(BOUND)
    assert not old.is_alive() and not new.is_alive()
    assert not isinstance(seen["new"], Exception), seen["new"]
    assert ran == [{"n": 1}]
    results = Message.objects.filter(run=run, role="tool", tool_call_id="c1")
    assert [m.content for m in results] == ["counted"]
    assert ToolApproval.objects.get(run_id=str(run.pk)).run_outcome == "ok"
    assert [f.result for f in seen["old"]] == ["counted"]
    assert list(
        Message.objects.filter(run=run, role="assistant").values_list("content", flat=True)
    ) == ["", "Done."]
    if connection.vendor == "postgresql":  # it found the call begun, then its result
        assert [f.result for f in seen["new"]] == ["counted"]


def test_a_card_asked_by_a_step_taken_over_is_not_asked_twice(conversation, alice):
    run = owned_run(conversation, alice)
    first = agent(conversation, run, ScriptedModel([("", [call("count", {"n": 1}, "c1")])]),
                  toolbox=counting_tool([]))  # fmt: skip
    steps = first.events()
    started = next(e for e in steps if isinstance(e, ToolStarted))
    assert isinstance(next(steps), Wait)
    # The owner pauses before it lets the run go; another process takes it over
    # and steps it: the card it finds is the one asked, not a second one.
    taken = take_over(run)
    seen = list(agent(conversation, taken, ScriptedModel([]), toolbox=counting_tool([])).events())
    assert [e for e in seen if isinstance(e, Wait)] == [Wait(started.approval_id)]
    assert ToolApproval.objects.filter(run_id=str(run.pk)).count() == 1


def test_stop_recorded_while_the_owner_paused_starts_nothing_new(conversation, alice):
    """Stop's message never reached the paused owner: the row alone stops it."""
    conversation.confirm_tool_calls = False
    conversation.save()
    run = owned_run(conversation, alice)
    ran: list = []

    def reply_after_stop(messages):
        Run.objects.filter(pk=run.pk).update(stop_requested=True)
        return "", [call("count", {"n": 1})]

    step = agent(conversation, run, ScriptedModel([reply_after_stop]), toolbox=counting_tool(ran))
    seen = list(step.events())
    assert seen[-1] == Done(cancelled=True)
    assert ran == []
    assert not Message.objects.filter(run=run, role="assistant").exists()
    assert not ToolApproval.objects.filter(run_id=str(run.pk)).exists()


def test_stop_after_a_call_was_allowed_keeps_it_from_beginning(conversation, alice):
    run = owned_run(conversation, alice)
    ran: list = []
    model = ScriptedModel([("", [call("count", {"n": 1})])])
    steps = agent(conversation, run, model, toolbox=counting_tool(ran)).events()
    started = next(e for e in steps if isinstance(e, ToolStarted))
    assert isinstance(next(steps), Wait)
    approval_decide(approval_id=started.approval_id, user=alice, decision="allow")
    Run.objects.filter(pk=run.pk).update(stop_requested=True)
    seen = list(agent(conversation, run, model, toolbox=counting_tool(ran)).events())
    assert ran == [] and seen[-1] == Done(cancelled=True)
    assert ToolApproval.objects.get(approval_id=started.approval_id).started_at is None


def test_the_heartbeat_says_which_runs_were_lost_and_which_stopped(conversation, alice, bob):
    from tests.factories import make_conversation

    kept = owned_run(conversation, alice)
    lost = owned_run(make_conversation(alice), alice)
    stopped = owned_run(make_conversation(alice), alice)
    take_over(lost)
    Run.objects.filter(pk=stopped.pk).update(stop_requested=True)
    claims = {str(r.pk): r.claim for r in (kept, lost, stopped)}
    beat = run_heartbeat(owner="process-a", claims=claims)
    assert (beat.lost, beat.stopped) == ([str(lost.pk)], [str(stopped.pk)])
    # The same number, but a claim of the same process since (a newer step):
    # the older step has lost it too.
    Run.objects.filter(pk=kept.pk).update(claim=kept.claim + 1)
    assert run_heartbeat(owner="process-a", claims={str(kept.pk): kept.claim}).lost == [
        str(kept.pk)
    ]


def test_a_takeover_waits_for_a_fenced_write_to_commit(conversation, alice):
    """The fence is the run's row lock, taken in the write's own transaction: a
    claim arriving meanwhile waits for it (PostgreSQL: seen waiting on the lock;
    SQLite: one writer at a time), then wins, and the old owner is fenced out."""
    run = owned_run(conversation, alice)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    run.refresh_from_db()
    locked, release, done = threading.Event(), threading.Event(), threading.Event()
    outcome: dict = {}

    def old_owner_writes() -> None:
        try:
            with transaction.atomic():
                run_fence(run_id=str(run.pk), owner="process-a", claim=run.claim)
                locked.set()
                assert release.wait(BOUND)
                Message.objects.create(conversation=conversation, run=run, role="assistant")
        finally:
            connections.close_all()

    def new_owner_claims() -> None:
        try:
            outcome["claim"] = run_claim(run_id=str(run.pk), owner="process-b")
        except Exception as exc:  # SQLite: the lock's busy timeout, bounded
            outcome["claim"] = exc
        finally:
            done.set()
            connections.close_all()

    writer, claimer = _second_waits_on_first(
        old_owner_writes, locked, new_owner_claims, statement='UPDATE "chat_run"'
    )
    if connection.vendor == "postgresql":
        assert not done.is_set()
    release.set()
    writer.join(BOUND)
    claimer.join(BOUND)
    assert not writer.is_alive() and not claimer.is_alive()
    assert Message.objects.filter(run=run, role="assistant").count() == 1  # committed first
    claim = outcome["claim"]
    assert claim is not None and not isinstance(claim, Exception), claim
    with pytest.raises(Fenced), transaction.atomic():
        run_fence(run_id=str(run.pk), owner="process-a", claim=run.claim)


def _second_waits_on_first(first, holding: threading.Event, second, *, statement: str):
    """Start ``first``; once it holds its lock (``holding``), start ``second`` and,
    on PostgreSQL, see it wait on a lock in ``statement``. Both threads, started."""
    one = threading.Thread(target=first)
    one.start()
    assert holding.wait(BOUND)
    two = threading.Thread(target=second)
    two.start()
    if connection.vendor == "postgresql":
        _until_waiting_on_a_lock(statement)
    return one, two


def _until_waiting_on_a_lock(statement: str) -> None:
    deadline = time.monotonic() + BOUND
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND starts_with(query, %s)",
                [statement],
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError(f"nothing waited on a lock in {statement}")

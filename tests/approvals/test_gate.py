"""The origin's gate scenarios, against Studio's gate and approval services.

Waiters run in real threads; every wait has a bound. Where a test must show
that the *event* (not the poll) woke the waiter, it sets a poll interval far
longer than the test's bound, so only the event can deliver in time.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from approvals.gate import Gate
from approvals.models import ToolApproval, new_approval_id
from approvals.services.decisions import ApprovalNotFound, approval_decide
from approvals.services.waiting import approval_cancel_run, approval_request, approval_wait
from studio.cancel import CancelToken
from tests.factories import make_conversation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]

LONG_POLL = 60.0  # longer than any bound below: only a wake can end a wait early
BOUND = 10.0


class Waiter(threading.Thread):
    """Runs approval_wait in a thread, as a run's worker does."""

    def __init__(self, slot, gate: Gate, *, cancel=None, timeout=BOUND * 2, poll=LONG_POLL):
        super().__init__(daemon=True)
        self.slot, self.gate, self.cancel = slot, gate, cancel
        self.timeout, self.poll = timeout, poll
        self.started_waiting = threading.Event()
        self.result: ToolApproval | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.started_waiting.set()
            self.result = approval_wait(
                slot=self.slot,
                cancel=self.cancel,
                timeout=self.timeout,
                poll=self.poll,
            )
        except BaseException as exc:  # surfaced by finish()
            self.error = exc
        finally:
            connections.close_all()

    def finish(self) -> ToolApproval:
        self.join(BOUND)
        assert not self.is_alive(), "waiter did not finish within the bound"
        if self.error:
            raise self.error
        assert self.result is not None
        return self.result


def request(conversation, gate, *, tool="python", arguments=None, run_id="run-1"):
    return approval_request(
        conversation=conversation,
        tool_name=tool,
        arguments=arguments or {"code": "print(42)"},
        requested_by=conversation.owner,
        run_id=run_id,
    )


def test_allow_wakes_the_waiter_with_allowed(conversation, alice, gate):
    approval, slot = request(conversation, gate)
    waiter = Waiter(slot, gate)
    waiter.start()
    assert waiter.started_waiting.wait(BOUND)
    result = approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")
    assert result.resolved
    outcome = waiter.finish()
    assert (outcome.status, outcome.reason) == ("allowed", "user")
    assert outcome.decided_by == alice


def test_deny_wakes_the_waiter_with_denied_and_the_note(conversation, alice, gate):
    approval, slot = request(conversation, gate)
    waiter = Waiter(slot, gate)
    waiter.start()
    approval_decide(approval_id=approval.approval_id, user=alice, decision="deny", note="use numpy")
    outcome = waiter.finish()
    assert (outcome.status, outcome.reason, outcome.note) == ("denied", "user", "use numpy")


def test_slot_is_removed_after_the_wait(conversation, alice, gate):
    approval, slot = request(conversation, gate)
    assert gate.has(approval.approval_id)
    waiter = Waiter(slot, gate)
    waiter.start()
    approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")
    waiter.finish()
    assert not gate.has(approval.approval_id)
    assert len(gate) == 0


def test_approval_ids_are_unique_and_unguessable():
    ids = {new_approval_id() for _ in range(1000)}
    assert len(ids) == 1000
    for approval_id in ids:
        # token_urlsafe(16): 16 random bytes -> 22 URL-safe characters.
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", approval_id)


def test_rows_get_distinct_ids(conversation, gate):
    ids = {request(conversation, gate, run_id=f"r{i}")[0].approval_id for i in range(50)}
    assert len(ids) == 50


def test_decision_before_the_wait_is_not_lost(conversation, alice, gate):
    approval, slot = request(conversation, gate)
    # Decided after registration, before anyone waits.
    approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")
    assert slot.is_woken()
    outcome = approval_wait(slot=slot, timeout=BOUND, poll=LONG_POLL)
    assert outcome.status == "allowed"


def test_decision_between_the_reread_and_the_block_is_not_lost(
    conversation, alice, gate, monkeypatch
):
    """The nasty window: the waiter has read "pending" but not yet blocked."""
    approval, slot = request(conversation, gate)
    real_wait = slot.wait
    decided = threading.Event()

    def wait_after_deciding(timeout=None):
        if not decided.is_set():
            decided.set()
            approval_decide(approval_id=approval.approval_id, user=alice, decision="deny")
        return real_wait(timeout)

    monkeypatch.setattr(slot, "wait", wait_after_deciding)
    outcome = approval_wait(slot=slot, timeout=BOUND, poll=LONG_POLL)
    assert decided.is_set()
    assert outcome.status == "denied"


@pytest.mark.parametrize("approval_id", ["", "nope", "x" * 500, "../../etc/passwd"])
def test_unknown_or_empty_id_is_refused(alice, approval_id):
    with pytest.raises(ApprovalNotFound):
        approval_decide(approval_id=approval_id, user=alice, decision="allow")


def test_wrong_user_is_refused_and_the_right_one_still_works(conversation, alice, bob, gate):
    approval, slot = request(conversation, gate)
    with pytest.raises(ApprovalNotFound):
        approval_decide(approval_id=approval.approval_id, user=bob, decision="allow")
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert not slot.is_woken()
    assert approval_decide(approval_id=approval.approval_id, user=alice, decision="allow").resolved


def test_second_decision_is_refused_and_changes_nothing(conversation, alice, gate):
    approval, slot = request(conversation, gate)
    waiter = Waiter(slot, gate)
    waiter.start()
    assert approval_decide(approval_id=approval.approval_id, user=alice, decision="allow").resolved
    waiter.finish()
    before = ToolApproval.objects.get(pk=approval.pk)
    again = approval_decide(
        approval_id=approval.approval_id, user=alice, decision="deny", note="late"
    )
    assert again.resolved is False
    assert again.approval.status == "allowed"
    after = ToolApproval.objects.get(pk=approval.pk)
    assert (after.status, after.reason, after.note, after.decided_at) == (
        before.status,
        before.reason,
        before.note,
        before.decided_at,
    )


def test_cancel_breaks_the_wait(conversation, gate):
    approval, slot = request(conversation, gate)
    cancel = CancelToken()
    waiter = Waiter(slot, gate, cancel=cancel)
    waiter.start()
    assert waiter.started_waiting.wait(BOUND)
    cancel.cancel()
    outcome = waiter.finish()
    assert (outcome.status, outcome.reason) == ("denied", "cancelled")
    assert not gate.has(approval.approval_id)


def test_cancel_before_the_wait_ends_it_at_once(conversation, gate):
    _, slot = request(conversation, gate)
    cancel = CancelToken()
    cancel.cancel()
    outcome = approval_wait(slot=slot, cancel=cancel, timeout=BOUND, poll=LONG_POLL)
    assert outcome.reason == "cancelled"


def test_timeout_ends_the_wait_as_not_allowed(conversation, gate):
    approval, slot = request(conversation, gate)
    outcome = approval_wait(slot=slot, timeout=0.2, poll=LONG_POLL)
    assert (outcome.status, outcome.reason) == ("denied", "timeout")
    assert outcome.decided_by is None
    assert not gate.has(approval.approval_id)


def test_a_late_decision_after_timeout_is_refused(conversation, alice, gate):
    approval, slot = request(conversation, gate)
    approval_wait(slot=slot, timeout=0.1, poll=LONG_POLL)
    late = approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")
    assert late.resolved is False
    assert late.approval.reason == "timeout"


def test_two_pending_calls_in_one_conversation_are_independent(conversation, alice, gate):
    first, slot1 = request(conversation, gate, arguments={"code": "1"})
    second, slot2 = request(conversation, gate, arguments={"code": "2"})
    w1, w2 = Waiter(slot1, gate), Waiter(slot2, gate)
    w1.start()
    w2.start()
    approval_decide(approval_id=second.approval_id, user=alice, decision="deny")
    assert w2.finish().status == "denied"
    assert w1.is_alive()
    assert ToolApproval.objects.get(pk=first.pk).status == "pending"
    approval_decide(approval_id=first.approval_id, user=alice, decision="allow")
    assert w1.finish().status == "allowed"


def test_25_concurrent_waiters_each_get_their_own_decision(alice, gate):
    conversations = [make_conversation(alice) for _ in range(5)]
    waiters = []
    for i in range(25):
        approval, slot = request(
            conversations[i % 5], gate, arguments={"code": str(i)}, run_id=f"r{i}"
        )
        waiter = Waiter(slot, gate)
        waiter.start()
        waiters.append((i, approval, waiter))
    for i, approval, _ in waiters:
        decision = "allow" if i % 2 == 0 else "deny"
        threading.Thread(
            target=lambda a=approval, d=decision: (
                approval_decide(approval_id=a.approval_id, user=alice, decision=d),
                connections.close_all(),
            )
        ).start()
    for i, approval, waiter in waiters:
        outcome = waiter.finish()
        assert outcome.approval_id == approval.approval_id
        assert outcome.status == ("allowed" if i % 2 == 0 else "denied")
    assert len(gate) == 0


def test_closing_a_run_removes_slots_never_waited_on(conversation, gate):
    first, _ = request(conversation, gate, run_id="run-x")
    second, _ = request(conversation, gate, run_id="run-x", arguments={"code": "2"})
    other, _ = request(conversation, gate, run_id="run-y")
    assert approval_cancel_run(run_id="run-x") == 2
    assert not gate.has(first.approval_id) and not gate.has(second.approval_id)
    assert gate.has(other.approval_id)
    for approval in (first, second):
        approval.refresh_from_db()
        assert (approval.status, approval.reason) == ("denied", "cancelled")
    assert ToolApproval.objects.get(pk=other.pk).status == "pending"


def test_always_allow_makes_a_rule_for_that_tool_in_that_conversation(conversation, alice, gate):
    other_conversation = make_conversation(alice)
    approval, _ = request(conversation, gate)
    result = approval_decide(approval_id=approval.approval_id, user=alice, decision="always")
    assert (result.approval.status, result.approval.reason) == ("allowed", "always_allow")
    rules = list(conversation.rules.active().values_list("tool", "pattern", "action", "scope"))
    assert rules == [("python", "", "allow", "conversation")]
    assert result.approval.rule_snapshot["id"] == conversation.rules.get().pk
    assert not other_conversation.rules.exists()


def test_register_refuses_an_empty_or_duplicate_id(gate):
    with pytest.raises(ValueError):
        gate.register("", run_id="r")
    gate.register("abc", run_id="r")
    with pytest.raises(ValueError):
        gate.register("abc", run_id="r")


def test_a_slot_needs_a_run(gate):
    """An empty run id would pool run-less slots, and one close_run would drop them all."""
    with pytest.raises(ValueError, match="run_id"):
        gate.register("abc", run_id="")


def test_closing_one_run_leaves_a_live_waiter_of_another_alone(conversation, gate):
    _, closing = request(conversation, gate, run_id="closing")
    other, waiting = request(conversation, gate, run_id="live", arguments={"code": "2"})
    approval_cancel_run(run_id="closing")
    assert gate.has(other.approval_id) and not waiting.is_woken()


def decided_behind_the_gates_back(approval) -> None:
    """As if the decision's wake message was lost on its way."""
    from django.utils import timezone

    ToolApproval.objects.filter(pk=approval.pk).update(
        status="allowed", reason="user", decided_at=timezone.now()
    )


def test_process_poller_wakes_a_waiter_whose_wake_was_lost(conversation, gate):
    from approvals.services.waiting import approval_check, approval_poll_waiters

    approval, slot = request(conversation, gate)
    slot.waiting = True  # parked, as the engine marks it
    decided_behind_the_gates_back(approval)
    assert not slot.is_woken()
    assert approval_poll_waiters() == 1  # the first poll re-reads every waiting row
    assert slot.is_woken()
    outcome = approval_check(slot=slot, cancel=CancelToken(), deadline=time.monotonic() + BOUND)
    assert outcome.status == "allowed"


def test_later_polls_ask_only_for_what_was_decided_lately(conversation, gate):
    from approvals.services.waiting import approval_poll_waiters

    first, first_slot = request(conversation, gate, run_id="r1")
    second, second_slot = request(conversation, gate, run_id="r2", arguments={"code": "2"})
    first_slot.waiting = second_slot.waiting = True
    assert approval_poll_waiters() == 0  # full re-read: both pending
    decided_behind_the_gates_back(second)
    with CaptureQueriesContext(connection) as queries:
        assert approval_poll_waiters() == 1
    assert len(queries) == 1 and "IN (" not in queries[0]["sql"]
    assert second_slot.is_woken() and not first_slot.is_woken()


def test_poller_leaves_pending_rows_alone(conversation, gate):
    from approvals.services.waiting import approval_poll_waiters

    _, slot = request(conversation, gate)
    slot.waiting = True
    assert approval_poll_waiters() == 0
    assert not slot.is_woken()


def look(slot, cancel=None):
    from approvals.services.waiting import approval_check

    return approval_check(
        slot=slot, cancel=cancel or CancelToken(), deadline=time.monotonic() + BOUND
    )


def test_the_first_look_at_a_call_nothing_woke_reads_no_row(conversation, gate):
    _, slot = request(conversation, gate)
    with CaptureQueriesContext(connection) as queries:
        assert look(slot) is None
    assert len(queries) == 0
    # Later looks read the row: a self-poll may be what finds a lost wake.
    with CaptureQueriesContext(connection) as queries:
        assert look(slot) is None
    assert len(queries) == 1


def test_a_wake_from_elsewhere_before_the_first_look_is_read(conversation, gate):
    approval, slot = request(conversation, gate)
    decided_behind_the_gates_back(approval)
    gate.wake(approval.approval_id)  # the message of a decision made in another process
    assert look(slot).status == "allowed"


def test_a_wake_right_after_the_first_look_is_kept(conversation, gate):
    approval, slot = request(conversation, gate)
    assert look(slot) is None
    decided_behind_the_gates_back(approval)
    gate.wake(approval.approval_id)
    assert slot.is_woken()
    assert look(slot).status == "allowed"


def test_stop_before_the_first_look_ends_the_call_and_keeps_a_decision_that_won(conversation, gate):
    approval, slot = request(conversation, gate)
    cancel = CancelToken()
    cancel.cancel()
    decided_behind_the_gates_back(approval)  # decided here, its wake not yet delivered
    outcome = look(slot, cancel)
    assert (outcome.status, outcome.reason) == ("allowed", "user")


def test_stop_at_the_first_look_of_a_deleted_row_says_so(conversation, gate):
    approval, slot = request(conversation, gate)
    ToolApproval.objects.filter(pk=approval.pk).delete()
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(ApprovalNotFound):
        look(slot, cancel)


def approval_reads(queries) -> list[str]:
    return [
        q["sql"] for q in queries if q["sql"].startswith("SELECT") and "toolapproval" in q["sql"]
    ]


def test_a_decision_here_on_a_call_decided_elsewhere_answers_with_the_row_as_it_is(
    conversation, alice, gate
):
    approval, _ = request(conversation, gate)
    decided_behind_the_gates_back(approval)  # another process decided; its wake is on its way
    result = approval_decide(approval_id=approval.approval_id, user=alice, decision="deny")
    assert result.resolved is False
    assert (result.approval.status, result.approval.reason) == ("allowed", "user")
    assert ToolApproval.objects.get(pk=approval.pk).status == "allowed"


def test_a_decision_here_on_a_call_deleted_meanwhile_is_not_found(conversation, alice, gate):
    approval, _ = request(conversation, gate)
    ToolApproval.objects.filter(pk=approval.pk).delete()
    with pytest.raises(ApprovalNotFound):
        approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")

"""A waiter parked in one OS process, woken by a decision made in another."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.layers import get_channel_layer

from approvals.services.decisions import approval_decide
from studio.runtime import runtime
from tests.helpers.procs import read_line, spawn

BOUND = 30


def park_waiter(conversation, *, poll: float, timeout: float):
    # The child's process-wide poller runs at the same interval as its waiter.
    proc = spawn(
        "waiter_proc.py",
        str(conversation.pk),
        str(poll),
        str(timeout),
        STUDIO_APPROVAL_POLL_SECONDS=str(poll),
    )
    info = json.loads(read_line(proc, BOUND))
    assert info["inbox"], "the child process should record its inbox on the row"
    return proc, info["approval_id"]


def outcome(proc) -> dict:
    result = json.loads(read_line(proc, BOUND))
    proc.wait(BOUND)
    return result


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_decision_in_this_process_wakes_a_waiter_in_another_through_redis(conversation, alice):
    # Poll far longer than the child's own timeout: only the channel message
    # can deliver "allowed"; a lost message would end as "timeout".
    proc, approval_id = park_waiter(conversation, poll=120, timeout=BOUND - 5)
    try:
        assert approval_decide(approval_id=approval_id, user=alice, decision="allow").resolved
        assert outcome(proc) == {"status": "allowed", "reason": "user"}
    finally:
        proc.kill()


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_dropped_channel_message_is_covered_by_the_poll(conversation, alice, monkeypatch):
    dropped: list[tuple[str, dict]] = []
    outbox = runtime().outbox
    monkeypatch.setattr(outbox, "channel", lambda channel, msg: dropped.append((channel, msg)))
    proc, approval_id = park_waiter(conversation, poll=0.3, timeout=BOUND - 5)
    try:
        assert approval_decide(approval_id=approval_id, user=alice, decision="deny").resolved
        assert outcome(proc) == {"status": "denied", "reason": "user"}
        assert [m["approval_id"] for _, m in dropped] == [approval_id]
    finally:
        proc.kill()


async def test_inbox_message_wakes_a_local_slot(gate):
    """The per-process inbox: a message sent to it wakes the slot it names."""
    rt = runtime()
    await rt.start()
    inbox = rt.inbox.name
    assert inbox
    await rt.start()
    assert rt.inbox.name == inbox  # one per process and loop
    slot = gate.register("inbox-test-id", run_id="r")
    woken = asyncio.Event()
    loop = asyncio.get_running_loop()
    slot.on_wake(lambda: loop.call_soon_threadsafe(woken.set))
    await get_channel_layer().send(
        inbox, {"type": "approval.decided", "approval_id": "inbox-test-id"}
    )
    await asyncio.wait_for(woken.wait(), BOUND)
    assert slot.is_woken()

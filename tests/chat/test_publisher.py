"""A run's fragments: a status line alone waits, and goes with what follows when that is quick.

The publisher and the runtime's outbox are the real ones, on a runtime
started on the test's loop; a channel of the conversation's group (the
process's real channel layer) receives what a tab would.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from approvals.models import ToolApproval
from chat import engine, events, render
from chat.engine import Publisher
from studio.runtime import replace_runtime, restore_runtime, runtime
from tests.factories import make_approval, make_conversation, make_run, make_user

pytestmark = pytest.mark.django_db(transaction=True)

BOUND = 10.0  # seconds: no receive here waits longer
QUIET = 0.5  # seconds a tab is watched to show that nothing more came


@pytest.fixture
async def rt():
    old = runtime()
    fresh = replace_runtime()
    await fresh.start()
    yield fresh
    await fresh.stop()
    restore_runtime(old)


@pytest.fixture
async def tab(rt):
    """A channel in a fresh conversation's group, and a publisher for a run of it."""

    def make():
        conversation = make_conversation(make_user())
        return conversation, make_run(conversation)

    conversation, run = await sync_to_async(make)()
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(conversation.group_name, channel)
    publisher = await rt.off_loop(Publisher, conversation, run)
    return Tab(rt, layer, channel, publisher, conversation.group_name)


class Tab:
    def __init__(self, rt, layer, channel, publisher, group) -> None:
        self.rt, self.layer, self.channel = rt, layer, channel
        self.publisher, self.group = publisher, group

    async def next(self) -> str:
        return (await asyncio.wait_for(self.layer.receive(self.channel), BOUND))["html"]

    async def nothing_more(self) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(self.layer.receive(self.channel), QUIET)

    async def step(self, fn, *args, **kwargs):
        """``fn`` on a worker thread, as a run's step calls the publisher."""
        return await self.rt.off_loop(fn, *args, **kwargs)


async def test_a_later_send_arrives_after_its_delay(tab):
    later = await tab.step(tab.rt.outbox.group_later, tab.group, {"type": "t", "html": "a"}, 0.3)
    with pytest.raises(TimeoutError):  # a timer never fires early
        await asyncio.wait_for(tab.layer.receive(tab.channel), 0.1)
    assert await tab.next() == "a"
    assert not later.take_back()  # sent: too late to take it back


async def test_a_later_send_taken_back_in_time_is_never_sent(tab):
    later = await tab.step(tab.rt.outbox.group_later, tab.group, {"type": "t", "html": "a"}, 0.2)
    assert later.take_back()
    assert not later.take_back()  # once
    await tab.nothing_more()


async def test_delayed_sends_leave_in_the_order_they_are_due_not_asked(tab):
    """One timer for them all: a send due sooner than the timer sets it again."""
    later = tab.rt.outbox.group_later
    await tab.step(later, tab.group, {"type": "t", "html": "slow"}, 5.0)
    await tab.step(later, tab.group, {"type": "t", "html": "first"}, 0.02)
    taken = await tab.step(later, tab.group, {"type": "t", "html": "taken back"}, 0.05)
    await tab.step(later, tab.group, {"type": "t", "html": "quick"}, 0.1)
    await tab.step(later, tab.group, {"type": "t", "html": "quicker"}, 0.05)
    assert taken.take_back()

    assert await tab.next() == "first"
    assert await tab.next() == "quicker"
    assert await tab.next() == "quick"
    await tab.nothing_more()  # the 5 s one is not due yet


async def test_a_delayed_send_due_after_the_timer_does_not_wake_the_loop(tab, monkeypatch):
    loop = asyncio.get_running_loop()
    wakes = []
    real = loop.call_soon_threadsafe

    def counted(callback, *args, **kwargs):
        if callback == tab.rt.outbox._set_timer:
            wakes.append(callback)
        return real(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)

    def ten_status_lines():
        for i in range(10):
            tab.rt.outbox.group_later(tab.group, {"type": "t", "html": f"s{i}"}, 0.2 + i / 100)

    await tab.step(ten_status_lines)

    assert len(wakes) == 1  # the first set the timer; the others were due after it
    assert [await tab.next() for _ in range(10)] == [f"s{i}" for i in range(10)]


async def test_a_delayed_send_taken_back_sets_no_timer_of_its_own(tab, monkeypatch):
    outbox = tab.rt.outbox
    fired = []
    real = outbox._fire_due
    monkeypatch.setattr(outbox, "_fire_due", lambda: (fired.append(1), real()))
    taken = await tab.step(outbox.group_later, tab.group, {"type": "t", "html": "y"}, 0.3)
    await tab.step(outbox.group_later, tab.group, {"type": "t", "html": "x"}, 0.05)
    await tab.step(outbox.group_later, tab.group, {"type": "t", "html": "z"}, 30.0)
    assert taken.take_back()

    assert await tab.next() == "x"
    await tab.nothing_more()  # past the time "y" was due: no turn of the loop for it
    assert fired == [1]


async def test_a_quick_steps_status_goes_with_its_result_in_one_message(tab, monkeypatch):
    monkeypatch.setattr(engine, "STATUS_SECONDS", 30.0)
    publisher = tab.publisher
    await tab.step(publisher.event, engine.events.Status("Running echo…"))
    await tab.nothing_more()  # alone, it waits

    await tab.step(publisher.send, "<p>result</p>")
    await tab.step(publisher.flush)

    assert await tab.next() == render.run_status("Running echo…") + "<p>result</p>"
    await tab.nothing_more()  # taken back: not sent a second time


async def test_a_slow_steps_status_is_shown_on_its_own_and_not_again(tab, monkeypatch):
    monkeypatch.setattr(engine, "STATUS_SECONDS", 0.05)
    publisher = tab.publisher
    await tab.step(publisher.event, engine.events.Status("Running python…"))
    assert await tab.next() == render.run_status("Running python…")

    await tab.step(publisher.send, "<p>result</p>")
    await tab.step(publisher.flush)
    assert await tab.next() == "<p>result</p>"
    await tab.nothing_more()


async def test_a_status_after_other_fragments_goes_at_once_with_them(tab, monkeypatch):
    monkeypatch.setattr(engine, "STATUS_SECONDS", 30.0)
    publisher = tab.publisher
    await tab.step(publisher.send, "<p>the model's turn</p>")
    await tab.step(publisher.event, engine.events.Status("Running python…"))
    assert await tab.next() == "<p>the model's turn</p>" + render.run_status("Running python…")


async def test_a_status_never_holds_back_a_result(tab, monkeypatch):
    """A result (``urgent``) leaves at once, with the status that follows it."""
    monkeypatch.setattr(engine, "STATUS_SECONDS", 30.0)
    publisher = tab.publisher
    await tab.step(publisher.send, "<p>tool output</p>")
    publisher.urgent = True
    await tab.step(publisher.flush, delay=30.0)
    assert await tab.next() == "<p>tool output</p>"
    await tab.step(publisher.event, engine.events.Status("Thinking…"))
    await tab.nothing_more()


async def test_a_taken_back_or_sent_status_keeps_the_order_of_fragments(tab):
    """The timer firing races the next flush: either one message holds both, or
    the status arrives first. Never the status after what followed it, never twice."""
    publisher = tab.publisher
    seen = []
    for i in range(60):

        def status_then_result(i=i):
            publisher.send(f"<s{i}>")
            publisher.flush(delay=0.0005)  # the timer fires about when the flush below comes
            time.sleep((i % 4) * 0.0004)
            publisher.send(f"<r{i}>")
            publisher.flush()

        await asyncio.wait_for(tab.step(status_then_result), BOUND)
        first = await tab.next()
        if first == f"<s{i}><r{i}>":
            seen.append("together")
        else:
            assert first == f"<s{i}>"
            assert await tab.next() == f"<r{i}>"
            seen.append("apart")
    await tab.nothing_more()
    assert len(seen) == 60


# -- the status line and the controls, rendered once per argument ---------------------------


def test_the_status_line_is_escaped_and_rendered_once_per_text():
    render.run_status.cache_clear()
    first = render.run_status("Running <b>…")
    assert "Running &lt;b&gt;…" in first and "<b>" not in first
    assert render.run_status("Running <b>…") is first
    assert render.run_status("") != first
    assert render.run_status.cache_info().misses == 2


def test_the_controls_follow_the_conversation_and_the_script_prefix():
    from django.urls import set_script_prefix

    stop = render.run_controls(running=True, conversation_id=7)
    assert 'action="/c/7/stop/"' in stop and 'data-running="true"' in stop
    assert 'action="/c/8/stop/"' in render.run_controls(running=True, conversation_id=8)
    assert "stop-form" not in render.run_controls(running=False, conversation_id=7)
    set_script_prefix("/studio/")
    try:
        assert 'action="/studio/c/7/stop/"' in render.run_controls(running=True, conversation_id=7)
    finally:
        set_script_prefix("/")
    assert render.run_controls(running=True, conversation_id=7) == stop


# -- an announced call's card ---------------------------------------------------------------


def started(approval) -> events.ToolStarted:
    call = events.CallView("call_1", approval.tool_name, approval.arguments)
    return events.ToolStarted(
        message_id=1, call=call, approval_id=approval.approval_id, awaiting=True
    )


def test_an_announced_card_is_the_row_as_it_is_now_read_in_one_query():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversation = make_conversation(make_user())
    approval = make_approval(conversation)
    with CaptureQueriesContext(connection) as queries:
        pending = render.tool_started(started(approval))
    assert 'data-status="pending"' in pending and 'value="allow"' in pending
    assert len(queries) == 1, "the row comes with its conversation"
    # Decided before its card went out (another tab was quicker): the card says so.
    ToolApproval.objects.filter(pk=approval.pk).update(status=ToolApproval.Status.DENIED)
    decided = render.tool_started(started(approval))
    assert 'data-status="denied"' in decided and 'value="allow"' not in decided


def test_an_announced_card_whose_row_is_gone_is_an_error():
    approval = make_approval(make_conversation(make_user()))
    ToolApproval.objects.filter(pk=approval.pk).delete()
    with pytest.raises(ToolApproval.DoesNotExist):
        render.tool_started(started(approval))

"""A run's fragments: gathered, sent in order, with the status line at once.

The publisher and the runtime's outbox are the real ones, on a runtime
started on the test's loop; a channel of the conversation's group (the
process's real channel layer) receives what a tab would.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer

from approvals.models import ToolApproval
from chat import events, render
from chat.publisher import Publisher
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
    return Tab(rt, layer, channel, publisher, conversation)


class Tab:
    def __init__(self, rt, layer, channel, publisher, conversation) -> None:
        self.rt, self.layer, self.channel = rt, layer, channel
        self.publisher, self.conversation = publisher, conversation
        self.group = conversation.group_name

    async def next(self) -> str:
        return (await asyncio.wait_for(self.layer.receive(self.channel), BOUND))["html"]

    async def nothing_more(self) -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(self.layer.receive(self.channel), QUIET)

    async def step(self, fn, *args, **kwargs):
        """``fn`` on a worker thread, as a run's step calls the publisher."""
        return await self.rt.off_loop(fn, *args, **kwargs)


async def test_a_status_goes_at_once_with_what_came_before_it(tab):
    publisher = tab.publisher

    def deltas_then_status():
        publisher.event(events.Delta("hello"))  # the first delta leaves at once
        publisher.event(events.Delta(" world"))  # this one waits for FLUSH_SECONDS
        publisher.event(events.Status("Running python…"))

    await tab.step(deltas_then_status)
    assert "hello" in await tab.next()
    html = await tab.next()
    assert " world" in html and "Running python" in html  # one message
    await tab.nothing_more()


async def test_fragments_leave_in_the_order_they_were_flushed(tab):
    publisher = tab.publisher

    def many():
        for i in range(50):
            publisher.send(f"<f{i}>")
            publisher.flush()

    await tab.step(many)
    assert [await tab.next() for _ in range(50)] == [f"<f{i}>" for i in range(50)]
    await tab.nothing_more()


async def test_what_a_service_tells_goes_with_the_commit_and_dies_with_a_rollback(tab):
    from django.db import transaction

    from approvals.notify import CardChanged, tell

    approval = await sync_to_async(make_approval)(tab.conversation)

    def rolled_back():
        with pytest.raises(RuntimeError), transaction.atomic():
            tell(CardChanged(approval, "<no>"))
            raise RuntimeError

    told, commit = threading.Event(), threading.Event()

    def committed():
        with transaction.atomic():
            tell(CardChanged(approval, "<yes>"))
            told.set()
            assert commit.wait(BOUND)

    await tab.step(rolled_back)
    await tab.nothing_more()
    committing = asyncio.ensure_future(tab.step(committed))
    async with asyncio.timeout(BOUND):
        while not told.is_set():
            await asyncio.sleep(0.01)
    await tab.nothing_more()  # told, not yet committed
    commit.set()
    await committing
    assert await tab.next() == "<yes>"
    await tab.nothing_more()


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


def announced(approval) -> str:
    """The card as the publisher sends it: its row read now, then drawn."""
    event = started(approval)
    return render.tool_started(event, Publisher.approval_of(event))


def started(approval) -> events.ToolStarted:
    call = events.CallView("call_1", approval.tool_name, approval.arguments)
    return events.ToolStarted(
        message_id=1, call=call, approval_id=approval.approval_id, awaiting=True
    )


def test_an_announced_card_is_the_row_as_it_is_now_read_in_one_query():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    conversation = make_conversation(make_user())
    approval = make_approval(conversation, tool_name="terminal", arguments={"command": "ls"})
    with CaptureQueriesContext(connection) as queries:
        pending = announced(approval)
    assert 'data-status="pending"' in pending and 'value="allow"' in pending
    assert len(queries) == 1, "the row comes with its conversation"
    # A python card also says what shaped the chat's python session: one query more.
    python = make_approval(conversation)
    with CaptureQueriesContext(connection) as queries:
        assert "python session" in announced(python)
    assert len(queries) == 2
    # Decided before its card went out (another tab was quicker): the card says so.
    ToolApproval.objects.filter(pk=approval.pk).update(status=ToolApproval.Status.DENIED)
    decided = announced(approval)
    assert 'data-status="denied"' in decided and 'value="allow"' not in decided


def test_an_announced_card_whose_row_is_gone_is_an_error():
    approval = make_approval(make_conversation(make_user()))
    ToolApproval.objects.filter(pk=approval.pk).delete()
    with pytest.raises(ToolApproval.DoesNotExist):
        announced(approval)

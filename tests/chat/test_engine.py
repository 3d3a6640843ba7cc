"""The run engine: parked runs hold no thread, and resume on every way a wait can end.

Runs are started the way a socket starts them (``run_launch`` off the loop)
on the real runtime, with the demo model and the real sandboxed tools; the
test looks at the runtime's own counters to prove that nothing waits on a
thread.
"""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from dataclasses import replace

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.functional import SimpleLazyObject

from approvals.models import ToolApproval
from approvals.services import decisions as services
from approvals.services.decisions import approval_decide
from chat import engine
from chat.engine import Stepper, run_launch, run_stop
from chat.models import Message, Run
from chat.services import run_create
from studio.runtime import LocalRun, replace_runtime, restore_runtime, runtime
from tests.factories import make_conversation
from tests.helpers.procs import read_line, spawn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.anydb]

BOUND = 20.0


@pytest.fixture
async def rt():
    """A fresh runtime on this test's loop (four agent workers), put back after."""
    old = runtime()
    fresh = replace_runtime(agent_workers=4)
    await fresh.start()
    yield fresh
    for local in fresh.local_runs().values():
        local.cancel.cancel()
    for _ in range(200):
        if not fresh.local_runs():
            break
        await asyncio.sleep(0.05)
    await fresh.stop()
    restore_runtime(old)
    assert not fresh.local_runs(), "a run outlived its test"


async def until(predicate, timeout: float = BOUND) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await sync_to_async(predicate)():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def launch(conversation, text: str) -> str:
    launch = await runtime().off_loop(
        run_launch, conversation_id=conversation.pk, user=conversation.owner, text=text
    )
    assert launch.ok, launch
    return launch.run_id


async def parked(rt, conversation, text: str = "run python: print(6 * 7)") -> ToolApproval:
    """Start a run and wait until it is parked on its pending card."""
    run_id = await launch(conversation, text)
    await until(lambda: ToolApproval.objects.filter(run_id=run_id, status="pending").exists())
    await until(lambda: rt.local_runs()[run_id].parked)
    return await sync_to_async(ToolApproval.objects.get)(run_id=run_id)


def finished(conversation) -> bool:
    return not Run.objects.running().filter(conversation=conversation).exists()


def tool_result(conversation) -> str:
    return Message.objects.filter(conversation=conversation, role="tool").last().content


async def holds_no_thread(rt) -> None:
    """Parked: no run is working and, once the step that parked it has handed its
    worker back (just after the run is marked parked), no worker is busy."""
    assert rt.working_runs() == 0
    await until(lambda: rt.agent_pool.busy == 0)


@pytest.mark.parametrize(
    ("decision", "expected"),
    [("allow", r"^42\s*$"), ("deny", r"^The user declined to run this tool call\.$")],
)
async def test_a_parked_run_holds_no_thread_and_resumes_on_a_decision(
    rt, conversation, alice, decision, expected
):
    approval = await parked(rt, conversation)
    await holds_no_thread(rt)
    await sync_to_async(approval_decide)(
        approval_id=approval.approval_id, user=alice, decision=decision
    )
    await until(lambda: finished(conversation))
    assert re.match(expected, await sync_to_async(tool_result)(conversation))


async def test_a_parked_run_resumes_at_its_timeout(rt, conversation, settings):
    settings.STUDIO_APPROVAL_TIMEOUT = 0.5
    approval = await parked(rt, conversation)
    await holds_no_thread(rt)
    await until(lambda: finished(conversation))
    await sync_to_async(approval.refresh_from_db)()
    assert (approval.status, approval.reason) == ("denied", "timeout")
    assert (await sync_to_async(tool_result)(conversation)).startswith("Error: nobody decided")


async def test_stop_resumes_a_parked_run_and_ends_it(rt, conversation, alice):
    approval = await parked(rt, conversation)
    assert await rt.off_loop(run_stop, conversation_id=conversation.pk, user=alice)
    await until(lambda: finished(conversation))
    await sync_to_async(approval.refresh_from_db)()
    assert (approval.status, approval.reason) == ("denied", "cancelled")
    run = await sync_to_async(Run.objects.get)(conversation=conversation)
    assert run.status == "cancelled"


async def test_a_lost_wake_is_covered_by_the_process_poller(rt, conversation, settings):
    # Decided behind the gate's back: no wake at all, as if the message was
    # lost. The process poller (every 0.2 s here) finds the decided row.
    settings.STUDIO_APPROVAL_POLL_SECONDS = 0.2
    approval = await parked(rt, conversation)
    await sync_to_async(ToolApproval.objects.filter(pk=approval.pk).update)(
        status="allowed", reason="user", decided_at=timezone.now()
    )
    await until(lambda: finished(conversation))
    assert re.match(r"^42\s*$", await sync_to_async(tool_result)(conversation))


async def test_more_parked_runs_than_workers_all_resume(rt, alice):
    conversations = await sync_to_async(lambda: [make_conversation(alice) for _ in range(12)])()
    approvals = [await parked(rt, c, f"run python: print({c.pk})") for c in conversations]
    assert len(rt.local_runs()) == 12 > rt.agent_pool.workers
    await holds_no_thread(rt)
    for approval in approvals:
        await sync_to_async(approval_decide)(
            approval_id=approval.approval_id, user=alice, decision="allow"
        )
    for c in conversations:
        await until(lambda c=c: finished(c))
        assert (await sync_to_async(tool_result)(c)).strip() == str(c.pk)


@pytest.mark.services
async def test_a_decision_in_another_process_wakes_the_parked_run(rt, conversation, settings):
    """Through Redis to this process's inbox; the poll is far too slow to be the one."""
    settings.STUDIO_APPROVAL_POLL_SECONDS = 300
    approval = await parked(rt, conversation)
    assert approval.waiter_inbox == rt.inbox.name
    child = spawn("decide_proc.py", approval.approval_id, conversation.owner.username, "allow")
    try:
        assert (await asyncio.to_thread(read_line, child, BOUND)).strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert '"resolved": true' in await asyncio.to_thread(read_line, child, BOUND)
        await until(lambda: finished(conversation), timeout=10)
    finally:
        child.kill()
    assert re.match(r"^42\s*$", await sync_to_async(tool_result)(conversation))


# --- one run per conversation --------------------------------------------------------


async def test_sends_racing_from_several_tabs_start_one_run(rt, alice, settings):
    """Single process (no Redis): a run just created is never retired as a dead one.

    Each round, four tabs send at once while no run is going; the run that
    wins parks on a card (so it is still running while the others try), and
    is stopped before the next round.
    """
    settings.REDIS_URL = ""
    conversation = await sync_to_async(make_conversation)(alice)
    for round_ in range(10):
        results = await asyncio.gather(
            *[
                rt.off_loop(
                    run_launch,
                    conversation_id=conversation.pk,
                    user=alice,
                    text=f"run python: print({round_})",
                )
                for _ in range(4)
            ]
        )
        assert sum(r.ok for r in results) == 1, results
        assert {r.reason for r in results if not r.ok} == {"running"}
        await until(lambda: ToolApproval.objects.pending().exists())
        assert await rt.off_loop(run_stop, conversation_id=conversation.pk, user=alice)
        await until(lambda: finished(conversation))
    statuses = await sync_to_async(lambda: list(Run.objects.values_list("status", flat=True)))()
    assert statuses == ["cancelled"] * 10  # one per round; none retired as dead ("error")


async def test_a_send_in_the_window_after_another_runs_row_is_written_is_refused(
    rt, alice, settings, monkeypatch
):
    """The window that let two tabs start two runs: tab A's run row is committed
    but its run not yet started; tab B's send arrives right then. B must be
    refused; A's run must not be retired as a dead one."""
    import threading

    from chat import engine

    settings.REDIS_URL = ""  # single process: the "is it dead?" path
    conversation = await sync_to_async(make_conversation)(alice)
    in_window, go_on = threading.Event(), threading.Event()
    real_run_create = engine.run_create

    def first_waits_in_the_window(**kwargs):
        run = real_run_create(**kwargs)
        if not in_window.is_set():
            in_window.set()
            go_on.wait(BOUND)
        return run

    monkeypatch.setattr(engine, "run_create", first_waits_in_the_window)
    send = {"conversation_id": conversation.pk, "user": alice, "text": "run python: print(1)"}
    first = asyncio.ensure_future(rt.off_loop(run_launch, **send))
    assert await asyncio.to_thread(in_window.wait, BOUND)
    second = await rt.off_loop(run_launch, **send)
    go_on.set()
    first = await first
    assert first.ok and (second.ok, second.reason) == (False, "running")
    run = await sync_to_async(Run.objects.get)()
    assert (str(run.pk), run.status) == (first.run_id, "running")
    assert await rt.off_loop(run_stop, conversation_id=conversation.pk, user=alice)
    await until(lambda: finished(conversation))


async def test_a_runs_first_step_does_not_read_back_what_its_launch_wrote(rt, alice):
    """The launch hands the run its row and the user's message (with the
    conversation it read): the first step reads neither back."""

    def first_step():
        conversation = make_conversation(alice)
        request = HttpRequest()  # a view's request.user holds its request
        launched = run_create(
            run_id=str(uuid.uuid4()),
            conversation_id=conversation.pk,
            user=SimpleLazyObject(lambda: request and alice),
            text="hello",
            inbox=rt.inbox.name,
        )
        local = LocalRun(launched[0].pk, conversation.pk, launched=launched)
        stepper = Stepper(local)
        with CaptureQueriesContext(connection) as queries:
            stepper._begin()
        return launched, stepper, [q["sql"] for q in queries]

    (run, message), stepper, sql = await rt.off_loop(first_step)
    assert message.role == "user" and message.content == "hello" and message.run_id == run.pk
    assert not [q for q in sql if "chat_run" in q or "chat_message" in q], sql
    assert stepper.agent.run is run and stepper.agent.conversation is run.conversation
    # A parked run lives for hours: it keeps a user of its own, not the lazy
    # one that keeps the launching request alive.
    assert type(stepper.agent.user) is type(alice) and stepper.agent.user.pk == alice.pk
    assert stepper.local.launched is None, "handed over once, not kept"


# -- the decided card and the run's next fragments -------------------------------------


class Tab:
    """A channel in the conversation's group: what a tab is sent."""

    def __init__(self, layer, channel) -> None:
        self.layer, self.channel = layer, channel

    @classmethod
    async def open(cls, conversation) -> Tab:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(conversation.group_name, channel)
        return cls(layer, channel)

    async def next(self, timeout: float = BOUND) -> dict:
        return await asyncio.wait_for(self.layer.receive(self.channel), timeout)

    async def until(self, needle: str) -> dict:
        """Every message up to the first whose HTML holds ``needle``; returns that one."""
        while needle not in (message := await self.next())["html"]:
            pass
        return message


async def watched(rt, conversation) -> tuple[Tab, ToolApproval]:
    """A tab on a run parked on its pending card, with everything before the card read."""
    tab = await Tab.open(conversation)
    approval = await parked(rt, conversation)
    await tab.until('data-status="pending"')
    return tab, approval


async def decide(approval, user, decision: str) -> None:
    await sync_to_async(approval_decide)(
        approval_id=approval.approval_id, user=user, decision=decision
    )


@pytest.fixture
def held_python(monkeypatch):
    """The python tool answers only once the test lets it (or BOUND passes)."""
    from chat import tools
    from chat.tools.base import ToolResult

    release = threading.Event()

    def run(arguments, **_):
        release.wait(BOUND)
        return ToolResult(f"held {arguments['code']}")

    held = tuple(replace(t, run=run) if t.name == "python" else t for t in tools.ALWAYS)
    monkeypatch.setattr(tools, "ALWAYS", held)
    return release


async def test_a_card_decided_for_a_run_parked_here_reaches_the_tabs_with_its_result(
    rt, conversation, alice, monkeypatch
):
    """One message, the card first: the run's next fragments carry it."""
    # Neither the card nor the status line leaves on a timer here: only the
    # run's fragments can bring the card.
    monkeypatch.setattr(services, "CARD_SECONDS", BOUND)
    monkeypatch.setattr(engine, "STATUS_SECONDS", BOUND)
    tab, approval = await watched(rt, conversation)

    await decide(approval, alice, "allow")

    message = await tab.next()
    html = message["html"]
    assert message["type"] == "chat.fragment"
    assert f'id="approval-{approval.approval_id}"' in html and 'data-status="allowed"' in html
    assert html.index('data-status="allowed"') < html.index("data-tool-result=")
    assert re.search(r'<pre class="output">42\s*</pre>', html)
    await until(lambda: finished(conversation))


async def test_a_slow_tool_does_not_hold_the_decided_card_back(
    rt, conversation, alice, held_python
):
    tab, approval = await watched(rt, conversation)

    await decide(approval, alice, "allow")

    # The tool is still running: the card comes on its timer, without a result.
    html = (await tab.until('data-status="allowed"'))["html"]
    assert "data-tool-result=" not in html
    held_python.set()
    html = (await tab.until("data-tool-result="))["html"]
    assert "held print(6 * 7)" in html
    await until(lambda: finished(conversation))


async def test_a_run_that_cannot_step_yet_does_not_hold_the_decided_card_back(
    rt, conversation, alice
):
    """Every worker busy: the woken run waits for one, and the card goes on its own."""
    tab, approval = await watched(rt, conversation)
    busy = threading.Event()
    loop = asyncio.get_running_loop()
    blockers = [
        loop.run_in_executor(rt.agent_pool, busy.wait, BOUND) for _ in range(rt.agent_pool.workers)
    ]
    await until(lambda: rt.agent_pool.busy == rt.agent_pool.workers)
    try:
        await decide(approval, alice, "allow")
        message = await tab.until('data-status="allowed"')
        assert message["type"] == "approval.changed"
        assert not await sync_to_async(finished)(conversation)  # the run has not moved
    finally:
        busy.set()
        await asyncio.gather(*blockers)
    await tab.until("data-tool-result=")
    await until(lambda: finished(conversation))


async def test_an_always_allow_card_is_sent_at_once_with_its_settings(
    rt, conversation, alice, monkeypatch, held_python
):
    """Its tabs also redraw the rules panel: it goes as the decision's own message."""
    monkeypatch.setattr(services, "CARD_SECONDS", BOUND)
    tab, approval = await watched(rt, conversation)

    await decide(approval, alice, "always")

    message = await tab.until('data-status="allowed"')
    assert (message["type"], message["reason"]) == ("approval.changed", "always_allow")
    held_python.set()
    await until(lambda: finished(conversation))


# -- a decision made by a request wakes the run once it is answered ---------------------


async def post_decision(approval, user, decision: str = "allow") -> list[dict]:
    """The decision POST through the server's own HTTP handler, as a browser's JSON
    call; returns what the handler sent back."""
    from django.middleware.csrf import _get_new_csrf_string
    from django.test import Client

    import studio.asgi

    client = Client()
    await sync_to_async(client.force_login)(user)
    session, csrf = client.cookies["sessionid"].value, _get_new_csrf_string()
    path = f"/approvals/{approval.approval_id}/decide/"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "headers": [
            (b"host", b"testserver"),
            (b"cookie", f"sessionid={session}; csrftoken={csrf}".encode()),
            (b"x-csrftoken", csrf.encode()),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"accept", b"application/json"),
        ],
    }
    body = f"decision={decision}".encode()
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await asyncio.wait_for(studio.asgi.django_asgi_app(scope, receive, send), BOUND)
    return sent

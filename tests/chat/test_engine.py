"""The run engine: a waiting run is only rows, and resumes on every way a wait can end.

Runs are started the way a socket starts them (``run_launch`` off the loop)
on the real runtime, with the demo model and the real sandboxed tools; the
test looks at the runtime's own tables and the run's row to prove that a
waiting run holds nothing in the process.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from chat.models import Message, Run
from chat.runs.commands import run_launch, run_stop
from chat.runs.driver import RESUMED_TEXT
from chat.runs.local import local_runs
from studio.runtime import runtime
from tests.factories import make_conversation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.anydb]

BOUND = 20.0


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


def run_row(run_id) -> Run:
    return Run.objects.get(pk=run_id)


async def waiting(rt, conversation, text: str = "run python: print(6 * 7)") -> ToolApproval:
    """Start a run and wait until it waits on its pending card, as rows only."""
    run_id = await launch(conversation, text)
    await until(lambda: run_row(run_id).state == "waiting")
    approval = await sync_to_async(ToolApproval.objects.get)(run_id=run_id)
    run = await sync_to_async(run_row)(run_id)
    assert approval.is_pending and run.waiting_on == approval.approval_id
    return approval


def finished(conversation) -> bool:
    return not Run.objects.running().filter(conversation=conversation).exists()


def tool_result(conversation) -> str:
    return Message.objects.filter(conversation=conversation, role="tool").last().content


async def holds_nothing(rt) -> None:
    """Waiting: no run is stepped here, and no worker is busy."""
    await until(lambda: not local_runs(rt).all() and rt.agent_pool.busy == 0)


@pytest.mark.parametrize(
    ("decision", "expected"),
    [("allow", r"^42\s*$"), ("deny", r"^The user declined to run this tool call\.$")],
)
async def test_a_waiting_run_holds_nothing_and_resumes_on_a_decision(
    rt, conversation, alice, decision, expected
):
    approval = await waiting(rt, conversation)
    await holds_nothing(rt)
    await sync_to_async(approval_decide)(
        approval_id=approval.approval_id, user=alice, decision=decision
    )
    await until(lambda: finished(conversation))
    assert re.match(expected, await sync_to_async(tool_result)(conversation))
    run = await sync_to_async(Run.objects.get)(conversation=conversation)
    assert (run.status, run.owner, run.waiting_on, run.resumes) == ("done", "", "", 0)


async def test_a_waiting_run_resumes_at_its_timeout(rt, conversation, settings):
    settings.STUDIO_APPROVAL_TIMEOUT = 0.5
    approval = await waiting(rt, conversation)
    await holds_nothing(rt)
    await until(lambda: finished(conversation))
    await sync_to_async(approval.refresh_from_db)()
    assert (approval.status, approval.reason) == ("denied", "timeout")
    assert (await sync_to_async(tool_result)(conversation)).startswith("Error: nobody decided")


async def test_stop_ends_a_waiting_run(rt, conversation, alice):
    approval = await waiting(rt, conversation)
    assert await rt.off_loop(run_stop, conversation_id=conversation.pk, user=alice)
    await until(lambda: finished(conversation))
    await sync_to_async(approval.refresh_from_db)()
    assert (approval.status, approval.reason) == ("denied", "cancelled")
    run = await sync_to_async(Run.objects.get)(conversation=conversation)
    assert run.status == "cancelled"


async def test_a_lost_resume_is_covered_by_the_sweep(rt, conversation):
    # Decided behind the services' back: nothing resumes the run, as if the
    # process that decided died right after its commit. The sweep finds it.
    approval = await waiting(rt, conversation)
    await sync_to_async(ToolApproval.objects.filter(pk=approval.pk).update)(
        status="allowed", reason="user", decided_at=timezone.now()
    )
    await until(lambda: finished(conversation))
    assert re.match(r"^42\s*$", await sync_to_async(tool_result)(conversation))


async def test_more_waiting_runs_than_workers_all_resume(rt, alice):
    conversations = await sync_to_async(lambda: [make_conversation(alice) for _ in range(12)])()
    approvals = [await waiting(rt, c, f"run python: print({c.pk})") for c in conversations]
    assert 12 > rt.agent_pool.workers
    await holds_nothing(rt)
    for approval in approvals:
        await sync_to_async(approval_decide)(
            approval_id=approval.approval_id, user=alice, decision="allow"
        )
    for c in conversations:
        await until(lambda c=c: finished(c))
        assert (await sync_to_async(tool_result)(c)).strip() == str(c.pk)


async def test_a_run_whose_process_died_is_resumed_and_its_tabs_told(rt, conversation, alice):
    """Its owner stopped beating: the sweep claims it, and the tabs read that it goes on."""
    tab = await Tab.open(conversation)
    approval = await waiting(rt, conversation)
    await sync_to_async(approval_decide)(
        approval_id=approval.approval_id, user=alice, decision="allow"
    )
    await until(lambda: finished(conversation))
    # A second run, caught working by a process that then died.
    run_id = await launch(conversation, "hello")
    await until(lambda: finished(conversation))
    stale = timezone.now() - timedelta(hours=1)
    await sync_to_async(Run.objects.filter(pk=run_id).update)(
        status="running", owner="specific.dead!process", heartbeat_at=stale
    )
    await sync_to_async(Message.objects.filter(run_id=run_id).exclude(role="user").delete)()
    await tab.until(RESUMED_TEXT)
    await until(lambda: finished(conversation))
    run = await sync_to_async(Run.objects.get)(pk=run_id)
    assert (run.status, run.resumes) == ("done", 1)
    roles = await sync_to_async(
        lambda: list(Message.objects.filter(run_id=run_id).values_list("role", flat=True))
    )()
    assert roles == ["user", "assistant"]  # answered once, from the last committed message


# --- one run per conversation --------------------------------------------------------


async def test_sends_racing_from_several_tabs_start_one_run(rt, alice, settings):
    """Each round, four tabs send at once while no run is going; the run that
    wins waits on a card (so it is still running while the others try), and
    is stopped before the next round."""
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
    assert statuses == ["cancelled"] * 10  # one per round


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
    """A tab on a run waiting on its pending card, with everything before the card read."""
    tab = await Tab.open(conversation)
    approval = await waiting(rt, conversation)
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


async def test_a_decided_calls_result_goes_out_before_the_model_is_asked_again(
    rt, conversation, alice, monkeypatch
):
    """The member watches the card: its result does not wait for the next request's
    transcript, held here until the tab has the result (or 5 s have passed)."""
    from chat import agent

    result_seen = threading.Event()
    first = []  # per request built: whether the tab had the result by then
    build = agent.transcript_build

    def held_build(*args, **kwargs):
        first.append(result_seen.wait(5))
        return build(*args, **kwargs)

    tab, approval = await watched(rt, conversation)
    monkeypatch.setattr(agent, "transcript_build", held_build)
    await decide(approval, alice, "allow")
    html = (await tab.until("data-tool-result="))["html"]
    result_seen.set()
    assert "42" in html
    await until(lambda: finished(conversation))
    assert first == [True]


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

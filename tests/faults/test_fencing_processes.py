"""A frozen owner comes back after a takeover: two real daphne processes (issue 54).

Process A steps a run and is frozen (SIGSTOP, as a long GC pause, swapping
or a paused VM would) past STUDIO_RUN_STALE_SECONDS; process B takes the run
over, as designed. Then A goes on (SIGCONT). Before fencing, A saved a second
model turn, a second card and ran the tool a second time, after the run was
done; and after Stop it ran the tool anyway. Now every tool runs at most
once, nothing runs after Stop, and no row is doubled.
"""

from __future__ import annotations

import json
import threading

import pytest

from approvals.models import ToolApproval
from chat.models import Message
from tests.helpers.clients import APPROVAL_ID, Browserish, Tab, session_cookie
from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks, tool_call_chunks
from tests.helpers.live import two_servers
from tests.helpers.procs import until
from tests.helpers.runs import run_of
from tests.helpers.services import cluster_env

pytestmark = [
    pytest.mark.services,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("root_sandbox"),
]

BOUND = 10.0
# Each run of the python call leaves a line: the count of its runs.
COUNT = "open('count.txt', 'a').write('ran\\n'); print('counted')"


@pytest.fixture
def model():
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def cluster(redis_server, workspace_root, tmp_path, model):
    env = {
        **cluster_env(redis_server.url, workspace_root),
        "LLM_BASE_URL": model.base_url,
        "LLM_MODEL": "fake-small",
    }
    with two_servers(tmp_path, **env) as pair:
        yield pair


def python_call(call_id: str, code: str = COUNT) -> Reply:
    return Reply(
        chunks=tool_call_chunks(0, call_id, "python", json.dumps({"code": code})),
        finish_reason="tool_calls",
    )


def count(conversation) -> int:
    path = conversation.workspace / "count.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def rows(conversation) -> dict[str, int]:
    """What the run wrote: model turns with calls, results per call, approval rows."""
    messages = Message.objects.filter(conversation=conversation)
    turns = [m for m in messages.filter(role="assistant") if m.tool_calls]
    results = list(messages.filter(role="tool").values_list("tool_call_id", flat=True))
    return {
        "turns with calls": len(turns),
        "results": len(results),
        "calls answered twice": len(results) - len(set(results)),
        "approvals": ToolApproval.objects.filter(conversation=conversation).count(),
    }


@pytest.fixture
def started(cluster, conversation, alice):
    """A's tab, and a way to start the run there."""
    a, b = cluster
    tab = Tab(a.ws_url, conversation.pk, session_cookie(alice), origin=a.url)
    tab.until('id="transcript"')
    yield tab
    tab.close()


def a_gave_up(a, conversation) -> None:
    """Until A says it lost the run, or wrote what it must not have (then the
    assertions that follow say what)."""
    until(
        lambda: (
            "taken over" in a.log()
            or count(conversation) > 1
            or rows(conversation)["turns with calls"] > 1
            or rows(conversation)["calls answered twice"]
        ),
        "A noticing it lost the run",
    )


def held_python_call(model, call_id: str = "call_a") -> tuple[Reply, threading.Event]:
    """A reply with a python call that waits for its event; queued first."""
    held = threading.Event()
    reply = python_call(call_id)
    reply.hold = held
    model.replies.append(reply)
    return reply, held


def frozen_while(a, until_true, what: str) -> None:
    """Freeze A until ``until_true()`` (B took the run over and stepped it), then thaw it."""
    a.pause()
    try:
        until(until_true, what)
    finally:
        a.resume()


def test_frozen_while_the_model_answers(cluster, conversation, model, started):
    a, b = cluster
    conversation.confirm_tool_calls = False
    conversation.save()
    first, held = held_python_call(model)
    model.replies += [python_call("call_b"), Reply(chunks=content_chunks("Done."))]
    started.send("count once")
    assert first.arrived.wait(BOUND)
    frozen_while(a, lambda: run_of(conversation).status == "done", "B's takeover and end")
    held.set()  # A's reply arrives now, with a call of its own
    a_gave_up(a, conversation)
    assert count(conversation) == 1
    assert rows(conversation) == {
        "turns with calls": 1, "results": 1, "calls answered twice": 0, "approvals": 1,
    }  # fmt: skip
    assert run_of(conversation).resumes == 1


def test_frozen_while_its_tool_runs(cluster, conversation, model, started):
    a, b = cluster
    conversation.confirm_tool_calls = False
    conversation.save()
    code = (
        "import os, time\n"
        "open('count.txt', 'a').write('ran\\n')\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
        "print('finished')"
    )
    model.replies += [python_call("call_a", code), Reply(chunks=content_chunks("Interrupted."))]
    started.send("count once, slowly")
    until(lambda: count(conversation) == 1, "the call's start")
    a.pause()
    try:
        until(lambda: run_of(conversation).status == "done", "B's takeover and end")
        (conversation.workspace / "go").touch()  # the tool A started can end now
    finally:
        a.resume()
    a_gave_up(a, conversation)
    assert count(conversation) == 1
    [result] = Message.objects.filter(conversation=conversation, role="tool")
    assert result.content.startswith("Error: interrupted: the server stopped while this ran")
    assert rows(conversation)["calls answered twice"] == 0


def test_frozen_at_its_pending_card(cluster, conversation, alice, model, started):
    a, b = cluster
    model.replies += [python_call("call_a"), Reply(chunks=content_chunks("Done."))]
    started.send("count once, when allowed")
    frames = started.until('data-status="pending"')
    approval_id = APPROVAL_ID.findall(frames)[-1]
    a.pause()
    try:
        page = Browserish(b.url, session_cookie(alice))
        assert page.decide(approval_id, "allow").json()["resolved"] is True
        page.close()
        until(lambda: run_of(conversation).status == "done", "the run's end through B")
    finally:
        a.resume()
    assert count(conversation) == 1
    assert rows(conversation) == {
        "turns with calls": 1, "results": 1, "calls answered twice": 0, "approvals": 1,
    }  # fmt: skip


@pytest.mark.parametrize("thawed", ["after the takeover", "before any takeover"])
def test_stop_pressed_while_the_owner_is_frozen(
    cluster, conversation, alice, model, started, thawed
):
    a, b = cluster
    conversation.confirm_tool_calls = False
    conversation.save()
    first, held = held_python_call(model)
    started.send("count, but I will stop you")
    assert first.arrived.wait(BOUND)
    a.pause()
    try:
        stop = Tab(b.ws_url, conversation.pk, session_cookie(alice), origin=b.url)
        stop.until('id="transcript"')
        stop.ws.send(json.dumps({"action": "stop"}))
        until(lambda: run_of(conversation).stop_requested, "Stop recorded")
        if thawed == "after the takeover":
            until(lambda: run_of(conversation).status == "cancelled", "B ending the run")
        stop.close()
    finally:
        a.resume()
    held.set()  # A's reply arrives: a call it must not make
    until(lambda: run_of(conversation).status == "cancelled", "the run's end")
    if thawed == "after the takeover":
        a_gave_up(a, conversation)
    else:
        until(lambda: model.requests and not run_of(conversation).owner, "A letting go")
    assert count(conversation) == 0
    assert rows(conversation) == {
        "turns with calls": 0, "results": 0, "calls answered twice": 0, "approvals": 0,
    }  # fmt: skip

"""ChatConsumer on the real ASGI application, with real runs on the agent pool."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from chat import render
from chat.models import Message, Run
from chat.runs.local import local_runs
from studio.runtime import replace_runtime, restore_runtime, runtime
from tests.factories import make_approval, make_conversation
from tests.helpers.runtimes import cancel_local_runs
from tests.helpers.sockets import closed_with, open_socket, receive_until, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.anydb]

BOUND = 15.0
APPROVAL_ID = re.compile(r'data-approval-id="([^"]+)"')


@pytest.fixture(autouse=True)
async def no_runs_left():
    yield
    # Stop whatever a failed test left running, and wait for it to end.
    await cancel_local_runs(runtime())
    assert not local_runs().all(), "a run outlived its test"
    # This test's loop ends here: stop the runtime's tasks (and connections) on it.
    await runtime().stop()


async def send(comm, **data) -> None:
    await comm.send_to(text_data=json.dumps(data))


async def test_anonymous_is_refused_with_a_code_the_page_reads(conversation):
    comm, connected, _ = await open_socket(conversation.pk)
    assert connected
    await closed_with(comm, 4401)


async def test_other_members_conversation_is_refused(conversation, bob):
    comm, connected, _ = await open_socket(conversation.pk, bob)
    await closed_with(comm, 4404)


async def test_unknown_conversation_is_refused(alice):
    comm, connected, _ = await open_socket(999999, alice)
    await closed_with(comm, 4404)


async def test_unknown_path_is_refused_cleanly(alice):
    comm, connected, _ = await open_socket(0, alice, path="/ws/nope/")
    assert connected
    await closed_with(comm, 4404)


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://evil.example", "127.0.0.1"),
        # Same host, another port: any other local service's page.
        ("http://127.0.0.1:8310", "127.0.0.1:8300"),
        ("http://127.0.0.1", "127.0.0.1:8300"),
        # Same host and port, another scheme.
        ("https://127.0.0.1:8300", "127.0.0.1:8300"),
        # A host that is not ours, even when the page and the socket agree.
        ("http://evil.example", "evil.example"),
    ],
)
async def test_foreign_origin_is_refused(conversation, alice, origin, host):
    comm, connected, _ = await open_socket(conversation.pk, alice, origin=origin, host=host)
    assert not connected


async def test_same_origin_with_port_is_accepted(conversation, alice):
    comm, connected, _ = await open_socket(
        conversation.pk, alice, origin="http://127.0.0.1:8300", host="127.0.0.1:8300"
    )
    assert connected
    await comm.receive_from(timeout=BOUND)
    await comm.disconnect()


async def test_trusted_origin_behind_a_proxy_is_accepted(conversation, alice, settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://studio.example.com"]
    comm, connected, _ = await open_socket(
        conversation.pk, alice, origin="https://studio.example.com", host="127.0.0.1:8300"
    )
    assert connected
    await comm.disconnect()


# --- sessions that end ------------------------------------------------------------------


@sync_to_async
def logged_in_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


async def test_logging_out_closes_the_open_socket_and_refuses_its_actions(conversation, alice):
    client = await logged_in_client(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    comm, connected, _ = await open_socket(conversation.pk, alice, cookie=cookie)
    await comm.receive_from(timeout=BOUND)
    await sync_to_async(client.post)("/accounts/logout/")
    frames = await receive_until(comm, "session has ended")
    assert "notice-error" in frames
    await closed_with(comm, 4401)
    # The same (dead) session on a new socket cannot start anything either.
    again, connected, _ = await open_socket(conversation.pk, alice, cookie=cookie)
    await closed_with(again, 4401)
    assert not await sync_to_async(Run.objects.exists)()


@pytest.mark.parametrize("change", ["deactivated", "password"])
async def test_an_account_change_ends_the_sockets_session(conversation, alice, change):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)

    def change_account() -> None:
        if change == "deactivated":
            alice.is_active = False
        else:
            alice.set_password("a-brand-new-password-42")
        alice.save()

    await sync_to_async(change_account)()
    await receive_until(comm, "session has ended")
    await closed_with(comm, 4401)


async def test_a_dead_session_cannot_start_a_run_even_without_the_push(conversation, alice):
    """Every action checks the session itself: a lost push changes nothing."""
    from importlib import import_module

    from django.conf import settings

    client = await logged_in_client(alice)
    key = client.cookies["sessionid"].value
    comm, _, _ = await open_socket(conversation.pk, alice, cookie=f"sessionid={key}")
    await comm.receive_from(timeout=BOUND)
    # Ended behind the sockets' back, with no signal (as clearsessions or an
    # admin ending it in the session store would).
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    await sync_to_async(store.delete)()
    await send(comm, message="run python: print(1)")
    await receive_until(comm, "session has ended")
    await closed_with(comm, 4401)
    assert not await sync_to_async(Run.objects.exists)()
    assert not await sync_to_async(Message.objects.exists)()


async def test_connect_sends_the_current_state(conversation, alice):
    await sync_to_async(Message.objects.create)(
        conversation=conversation, role="user", content="earlier"
    )
    comm, connected, _ = await open_socket(conversation.pk, alice)
    assert connected
    frame = await comm.receive_from(timeout=BOUND)
    assert 'id="transcript"' in frame and "earlier" in frame
    assert 'id="run-controls"' in frame and 'data-running="false"' in frame
    await comm.disconnect()


async def test_a_page_just_drawn_gets_only_what_it_lacks(conversation, alice):
    """A page's first socket names when it was drawn: with nothing changed since,
    the catch-up leaves out the settings panel, the count and the sidebar (the
    page has them); once an approval came after it, they are sent too; a
    reconnect (no ``since``) always gets them."""
    other = await sync_to_async(make_conversation)(alice)
    drawn = int(time.time())

    def opening(since: int | None) -> str:
        return f"/ws/c/{conversation.pk}/" + ("" if since is None else f"?since={since}")

    comm, _, _ = await open_socket(conversation.pk, alice, path=opening(drawn))
    frame = await comm.receive_from(timeout=BOUND)
    assert 'id="transcript"' in frame and 'id="run-controls"' in frame
    assert 'id="settings"' not in frame and "approvals-count" not in frame
    assert "waiting-marker" not in frame
    await comm.disconnect()

    await sync_to_async(make_approval)(other)  # after the page was drawn
    comm, _, _ = await open_socket(conversation.pk, alice, path=opening(drawn))
    frame = await comm.receive_from(timeout=BOUND)
    assert 'id="settings"' in frame and 'data-pending-count="1"' in frame
    assert f'id="waiting-{other.pk}" class="waiting-marker" hx-swap-oob' in frame
    await comm.disconnect()

    for since in (None, drawn - 3600, drawn + 3600, "x"):
        path = f"/ws/c/{conversation.pk}/?since={since}" if since == "x" else opening(since)
        comm, _, _ = await open_socket(conversation.pk, alice, path=path)
        frame = await comm.receive_from(timeout=BOUND)
        assert 'id="settings"' in frame and 'data-pending-count="1"' in frame, since
        await comm.disconnect()


async def test_a_quick_answer_arrives_whole(conversation, alice):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)  # catch-up
    await send(comm, message="hello there")
    frames = await receive_until(comm, 'data-running="false"')
    assert 'data-state="accepted"' in frames
    assert "hello there" in frames  # the user's bubble
    assert "demo model" in frames  # the final, rendered answer
    # The demo model answers at once: no streaming bubble is worth opening.
    assert "beforeend:#stream-" not in frames
    await comm.disconnect()


async def test_a_typing_model_streams_in_batches(conversation, alice, settings):
    from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks

    words = [f"word{i} " for i in range(40)]
    with FakeOpenAI() as fake:
        settings.LLM_BASE_URL = fake.base_url
        fake.replies.append(Reply(chunks=content_chunks(*words), pace=0.02))
        comm, _, _ = await open_socket(conversation.pk, alice)
        await comm.receive_from(timeout=BOUND)
        await send(comm, message="type slowly")
        first = await receive_until(comm, "beforeend:#stream-")
        assert "word39" not in first  # streamed while the model was still typing
        frames = first + await receive_until(comm, 'data-running="false"')
        await comm.disconnect()
    streamed = frames.count("beforeend:#stream-")
    # Batched every ~50 ms: far fewer messages than the 40 pieces, but several.
    assert 3 <= streamed < len(words) / 2
    assert "word39" in frames and 'hx-swap-oob="delete"' in frames


# A decision reaches its open tab in this many frames (issue 54; lower it as
# frames go): the card decided, "Running python…", the result with
# "Thinking…", the answer with the run's end, the member's count.
DECISION_FRAMES = 5


async def test_tool_call_card_then_decision_then_result(conversation, alice):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    await send(comm, message="run python: print(6 * 7)")
    frames = await receive_until(comm, 'data-status="pending"')
    approval_id = APPROVAL_ID.findall(frames)[-1]
    for decision in ("allow", "always", "deny"):
        assert f'value="{decision}"' in frames
    assert "print(6 * 7)" in frames
    await receive_until(comm, 'id="approvals-count"')  # (the card's count, a moment after)
    await sync_to_async(approval_decide)(approval_id=approval_id, user=alice, decision="allow")
    got = [await receive_until(comm, 'data-status="allowed"')]
    while not all(end in "".join(got) for end in ('data-running="false"', 'id="approvals-count"')):
        got.append(await comm.receive_from(timeout=BOUND))
    assert await comm.receive_nothing(timeout=0.5)
    assert re.search(r"<pre class=\"output\">42\s*</pre>", "".join(got))
    assert len(got) <= DECISION_FRAMES, "\n".join(frame[:100] for frame in got)
    await comm.disconnect()


async def test_waiting_runs_hold_no_worker_and_a_pool_of_one_serves_a_new_chat(alice):
    """Runs waiting for a decision cost nothing in the process: 100 of them, and
    one worker, and a new conversation still gets its answer; then all 100 finish."""
    from tests.helpers.scripted import ScriptedModel  # noqa: F401 - the demo model is enough

    rt = runtime()
    old = rt
    rt = replace_runtime(agent_workers=1)
    try:
        conversations = await sync_to_async(
            lambda: [make_conversation(alice) for _ in range(100)]
        )()
        sockets = []
        for c in conversations:
            comm, _, _ = await open_socket(c.pk, alice)
            await comm.receive_from(timeout=BOUND)
            await send(comm, message=f"run python: print({c.pk})")
            sockets.append(comm)
        for comm in sockets:
            await receive_until(comm, 'data-status="pending"')
        # (A card goes out just before its step lets the run go.)
        await wait_for(lambda: not local_runs(rt).all() and rt.agent_pool.busy == 0)
        assert await sync_to_async(Run.objects.filter(owner="", status="running").count)() == 100
        # A new chat on the one worker while 100 wait: answered.
        other = await sync_to_async(make_conversation)(alice)
        comm, _, _ = await open_socket(other.pk, alice)
        await comm.receive_from(timeout=BOUND)
        await send(comm, message="hello")
        frames = await receive_until(comm, 'data-running="false"')
        assert 'data-state="accepted"' in frames and "demo model" in frames
        await comm.disconnect()
        # Every parked run resumes with its own result.
        pending = await sync_to_async(
            lambda: list(ToolApproval.objects.pending().values_list("approval_id", flat=True))
        )()
        assert len(pending) == 100
        for approval_id in pending:
            await sync_to_async(approval_decide)(
                approval_id=approval_id, user=alice, decision="allow"
            )
        for c, comm in zip(conversations, sockets, strict=True):
            frames = await receive_until(comm, 'data-running="false"', timeout=60)
            assert re.search(rf'<pre class="output">{c.pk}\s*</pre>', frames)
            await comm.disconnect()
    finally:
        await cancel_local_runs(rt)
        await rt.stop()
        restore_runtime(old)


async def test_second_message_during_a_run_is_refused(conversation, alice):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    await send(comm, message="run python: print(1)")
    await receive_until(comm, 'data-status="pending"')
    await send(comm, message="are you there?")
    frames = await receive_until(comm, 'data-state="refused"')
    assert "still working on your previous message" in frames
    assert not await sync_to_async(conversation.messages.filter(content="are you there?").exists)()
    await send(comm, action="stop")
    await receive_until(comm, 'data-running="false"')
    await comm.disconnect()


async def test_run_continues_after_the_socket_closes(conversation, alice):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    await send(comm, message="run python: print(6 * 7)")
    frames = await receive_until(comm, 'data-status="pending"')
    approval_id = APPROVAL_ID.findall(frames)[-1]
    await comm.disconnect()
    # It goes on without any socket (the card is out just before the run waits).
    await wait_for(lambda: Run.objects.get(conversation=conversation).state == "waiting")
    await sync_to_async(approval_decide)(approval_id=approval_id, user=alice, decision="allow")
    await wait_for(lambda: Run.objects.filter(conversation=conversation, status="done").exists())
    result = await sync_to_async(lambda: conversation.messages.filter(role="tool").get().content)()
    assert result.strip() == "42"


async def test_stop_cancels_the_run_and_its_pending_card(conversation, alice):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    await send(comm, message="run python: print(1)")
    await receive_until(comm, 'data-status="pending"')
    await send(comm, action="stop")
    frames = await receive_until(comm, 'data-running="false"')
    assert "Cancelled" in frames
    approval = await sync_to_async(ToolApproval.objects.get)()
    assert (approval.status, approval.reason) == ("denied", "cancelled")
    run = await sync_to_async(Run.objects.get)()
    assert run.status == "cancelled"
    await comm.disconnect()


async def test_every_tab_sees_the_decision(conversation, alice):
    tab1, _, _ = await open_socket(conversation.pk, alice)
    tab2, _, _ = await open_socket(conversation.pk, alice)
    await tab1.receive_from(timeout=BOUND)
    await tab2.receive_from(timeout=BOUND)
    await send(tab1, message="run python: print(1)")
    frames = await receive_until(tab2, 'data-status="pending"')
    approval_id = APPROVAL_ID.findall(frames)[-1]
    await sync_to_async(approval_decide)(approval_id=approval_id, user=alice, decision="deny")
    for tab in (tab1, tab2):
        frames = await receive_until(tab, 'data-status="denied"')
        assert approval_id in frames
    await receive_until(tab1, 'data-running="false"')
    await tab1.disconnect()
    await tab2.disconnect()


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "[1, 2]",
        json.dumps({"action": "explode"}),
        json.dumps({"message": 42}),
        "x" * 70000,
        "[" * 20_000 + "]" * 20_000,  # nested past Python's recursion limit
        '{"message": ' + "[" * 30_000 + "]" * 30_000 + "}",
        # Files sent with a message must be the workspace's own, named plainly.
        json.dumps({"message": "hi", "files": ["missing.txt"]}),
        json.dumps({"message": "hi", "files": ["../../etc/passwd"]}),
        json.dumps({"message": "hi", "files": "notes.txt"}),
        json.dumps({"message": "hi", "files": [{"name": "x"}]}),
    ],
)
async def test_bad_frames_get_a_notice_and_change_nothing(conversation, alice, frame):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    await comm.send_to(text_data=frame)
    frames = await receive_until(comm, 'id="notice"')
    assert "notice-error" in frames
    assert not await sync_to_async(Message.objects.exists)()
    assert not await sync_to_async(Run.objects.exists)()
    await comm.disconnect()


async def test_binary_frame_gets_a_notice(conversation, alice):
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    await comm.send_to(bytes_data=b"\x00\x01")
    assert "only understands text" in await receive_until(comm, 'id="notice"')
    await comm.disconnect()


async def test_model_server_dying_mid_stream(conversation, alice, settings):
    """An error in the chat, the history intact, and the conversation usable again."""
    from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks

    with FakeOpenAI() as fake:
        settings.LLM_BASE_URL = fake.base_url
        fake.replies.append(
            Reply(chunks=content_chunks("Part", "ial ", "answer ", "lost"), die_after=2)
        )
        fake.replies.append(Reply(chunks=content_chunks("Back ", "again.")))
        comm, _, _ = await open_socket(conversation.pk, alice)
        await comm.receive_from(timeout=BOUND)
        await send(comm, message="first question")
        frames = await receive_until(comm, 'data-running="false"')
        assert "msg-error" in frames and "closed the stream before the reply was finished" in frames
        await send(comm, message="second question")
        frames = await receive_until(comm, 'data-running="false"')
        assert "Back again." in frames
        await comm.disconnect()
    rows = await sync_to_async(lambda: list(conversation.messages.values_list("role", "content")))()
    assert rows == [
        ("user", "first question"),
        ("assistant", "Partial "),
        ("error", rows[2][1]),
        ("user", "second question"),
        ("assistant", "Back again."),
    ]
    # The model was sent the whole history the second time, the cut reply included.
    sent = [m["content"] for m in fake.requests[1]["messages"][1:]]
    assert sent == ["first question", "Partial ", "second question"]


async def test_a_run_left_by_a_previous_server_is_resumed_and_the_tab_told(
    conversation, alice, settings
):
    """Its process died mid-step: this one's sweep takes the run over and answers."""
    from datetime import timedelta

    from django.utils import timezone

    from chat.runs.driver import RESUMED_TEXT
    from tests.factories import make_run

    settings.STUDIO_APPROVAL_POLL_SECONDS = 0.1

    def left_behind():
        run = make_run(conversation, owner="specific.gone!1")
        Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        Message.objects.create(conversation=conversation, run=run, role="user", content="hello")
        return run

    dead = await sync_to_async(left_behind)()
    comm, _, _ = await open_socket(conversation.pk, alice)
    await comm.receive_from(timeout=BOUND)
    frames = await receive_until(comm, 'data-running="false"')
    assert RESUMED_TEXT in frames and "demo model" in frames
    await sync_to_async(dead.refresh_from_db)()
    assert (dead.status, dead.resumes) == ("done", 1)
    await comm.disconnect()


async def test_a_model_that_is_down_offers_a_retry_that_asks_it_again(
    conversation, alice, settings
):
    """Issue 37: Retry after the model failed; the internal URL is never shown."""
    from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks

    with FakeOpenAI() as fake:
        settings.LLM_BASE_URL = fake.base_url
        fake.replies.append(Reply(status=503))
        fake.replies.append(Reply(chunks=content_chunks("Back ", "again.")))
        comm, _, _ = await open_socket(conversation.pk, alice)
        await comm.receive_from(timeout=BOUND)
        await send(comm, action="retry")
        assert "nothing to retry" in await receive_until(comm, 'id="notice"')
        await send(comm, message="what is up?")
        frames = await receive_until(comm, 'data-running="false"')
        assert "msg-error" in frames and 'id="retry-button"' in frames
        assert fake.base_url not in frames and "127.0.0.1" not in frames
        await send(comm, action="retry")
        frames = await receive_until(comm, 'data-running="false"')
        assert "Back again." in frames and 'id="retry-button"' not in frames
        await comm.disconnect()
    # Asked again with the same question, once; no second copy of it.
    assert fake.requests[1]["messages"][-1] == {"role": "user", "content": "what is up?"}
    roles = await sync_to_async(
        lambda: list(conversation.messages.values_list("role", flat=True))
    )()
    assert roles == ["user", "error", "assistant"]


async def test_a_rules_use_counter_updates_live(conversation, alice):
    """Issue 37: "used N×" in the rules panel changes as the rule decides calls."""
    from approvals.models import ToolRule

    rule = await sync_to_async(ToolRule.objects.create)(
        tool="python",
        action="allow",
        scope="conversation",
        conversation=conversation,
        member=alice,
        created_by=alice,
    )
    comm, _, _ = await open_socket(conversation.pk, alice)
    assert f'id="rule-hits-{rule.pk}">used 0×' in await comm.receive_from(timeout=BOUND)
    await send(comm, message="run python: print(1)")
    frames = await receive_until(comm, f'id="rule-hits-{rule.pk}"')
    assert f'<span id="rule-hits-{rule.pk}" hx-swap-oob="outerHTML">used 1×</span>' in frames
    await receive_until(comm, 'data-running="false"')
    await comm.disconnect()


# --- a long chat ------------------------------------------------------------------------


def _long_chat(conversation, replies: int) -> None:
    for n in range(replies):
        Message.objects.create(conversation=conversation, role="user", content=f"ask-{n}")
        Message.objects.create(
            conversation=conversation, role="assistant", content=f"reply-{n} " + "words " * 1000
        )


async def test_a_long_chat_catches_up_in_frames_daphne_can_send(conversation, alice):
    """daphne refuses a message over 1 MiB; a chat whose transcript renders
    larger still catches its tab up, in order, in several frames."""
    await sync_to_async(_long_chat)(conversation, 40)
    comm, connected, _ = await open_socket(conversation.pk, alice)
    assert connected
    frames = []
    while not frames or 'id="run-controls"' not in frames[-1]:
        frames.append(await comm.receive_from(timeout=BOUND))
    await comm.disconnect()

    assert len(frames) > 2
    assert all(len(frame.encode()) < 1024 * 1024 for frame in frames)
    assert all(len(frame) <= render.FRAME_BUDGET for frame in frames[:-1])
    # The tab's transcript is replaced by an empty one, then every message is
    # appended once, in order.
    assert 'id="transcript"' in frames[0] and "reply-0" not in frames[0]
    everything = "".join(frames)
    said = [f"{kind}-{n}" for n in range(40) for kind in ("ask", "reply")]
    where = [re.search(rf"\b{text}\b", everything).start() for text in said]
    assert where == sorted(where)
    assert all(sum(bool(re.search(rf"\b{t}\b", f)) for f in frames) == 1 for t in said)


async def test_a_short_chat_catches_up_in_one_frame(conversation, alice):
    await sync_to_async(_long_chat)(conversation, 2)
    comm, connected, _ = await open_socket(conversation.pk, alice)
    first = await comm.receive_from(timeout=BOUND)
    await comm.disconnect()
    assert 'id="transcript"' in first and "reply-1" in first and 'id="run-controls"' in first


async def test_a_message_its_handler_fails_on_closes_the_socket_for_a_reconnect(
    conversation, alice
):
    """Closed with a code daphne accepts from an application (not 1011), on
    which the page reconnects and is caught up."""
    comm, connected, _ = await open_socket(conversation.pk, alice)
    await receive_until(comm, 'id="transcript"')
    await get_channel_layer().group_send(conversation.group_name, {"type": "chat.fragment"})
    while (output := await comm.receive_output(timeout=BOUND))["type"] != "websocket.close":
        pass
    assert output.get("code", 1000) == 1000


async def test_a_sockets_log_lines_name_its_member_and_conversation(conversation, alice, caplog):
    from studio.logs import ContextFilter

    caplog.handler.addFilter(ContextFilter())
    comm, connected, _ = await open_socket(conversation.pk, alice)
    await receive_until(comm, 'id="transcript"')
    await get_channel_layer().group_send(conversation.group_name, {"type": "chat.fragment"})
    while (await comm.receive_output(timeout=BOUND))["type"] != "websocket.close":
        pass
    [record] = [r for r in caplog.records if r.getMessage().startswith("socket: handling")]
    assert (record.user_id, record.conversation_id) == (str(alice.pk), str(conversation.pk))


async def test_a_fragment_reaches_its_tab_while_the_one_sync_thread_is_busy(conversation, alice):
    """Channels' consumers hop to the process's one sync thread before every
    message; a tab's fragments must not queue there behind other sockets'
    session loads or any slow sync call."""
    comm, connected, _ = await open_socket(conversation.pk, alice)
    await receive_until(comm, 'id="transcript"')
    occupied, released = threading.Event(), threading.Event()

    def occupy() -> None:
        occupied.set()
        released.wait(BOUND)

    busy = asyncio.ensure_future(sync_to_async(occupy)())
    try:
        deadline = time.monotonic() + BOUND
        while not occupied.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert occupied.is_set()
        html = '<p id="fragment">while busy</p>'
        await get_channel_layer().group_send(
            conversation.group_name, {"type": "chat.fragment", "html": html}
        )
        assert await comm.receive_from(timeout=5) == html
        assert not released.is_set() and not busy.done(), "the sync thread was busy throughout"
    finally:
        released.set()
        await busy
    await comm.disconnect()

"""STUDIO_APPROVAL_WEBHOOK_URL against a real HTTP receiver on loopback."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from approvals.webhook import webhook_claim_due, webhook_post, webhook_tick
from tests.factories import make_approval, make_conversation
from tests.helpers.receiver import Receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]
BOUND = 10.0


@pytest.fixture
def hook(settings):
    with Receiver() as receiver:
        settings.STUDIO_APPROVAL_WEBHOOK_URL = receiver.url
        settings.STUDIO_APPROVAL_WEBHOOK_AFTER = 60
        settings.STUDIO_APPROVAL_WEBHOOK_ATTEMPTS = 3
        settings.STUDIO_APPROVAL_WEBHOOK_BACKOFF = 0
        settings.STUDIO_SITE_URL = "https://studio.example"
        yield receiver


def waited(conversation, seconds: float, **fields) -> ToolApproval:
    requested_at = timezone.now() - timedelta(seconds=seconds)
    return make_approval(
        conversation,
        tool_name="terminal",
        arguments={"command": "make deploy"},
        subject="make deploy",
        requested_at=requested_at,
        **fields,
    )


def settled(approval: ToolApproval, timeout: float = BOUND) -> str:
    """The row's webhook result once its POST (with retries) is over."""
    deadline = timezone.now() + timedelta(seconds=timeout)
    while timezone.now() < deadline:
        result = ToolApproval.objects.get(pk=approval.pk).webhook_result
        if result:
            return result
        threading.Event().wait(0.02)
    raise AssertionError("the webhook never finished")


def test_fired_once_after_the_delay_with_a_text_chat_tools_show(hook, alice):
    conversation = make_conversation(alice, title="Release")
    due = waited(conversation, 61)
    waited(conversation, 30)  # not yet
    assert webhook_tick() == 1
    (post,) = hook.wait_for(1)
    assert settled(due) == "sent (attempt 1)"
    assert webhook_tick() == 0  # claimed once: never again
    link = f"https://studio.example/c/{conversation.pk}/#approval-{due.approval_id}"
    # The default detail: the tool, the member and the link, not what the model wrote.
    assert post == {
        "approval_id": due.approval_id,
        "tool": "terminal",
        "link": link,
        "requested_by": "alice",
        "waiting_since": due.requested_at.isoformat(),
        "needs_review": False,
        "text": f"alice's terminal call has waited for a decision since "
        f"{due.requested_at:%H:%M} UTC — {link}",
    }
    assert len(hook.posts) == 1


def test_full_detail_adds_the_arguments_and_the_title_as_code(hook, alice, settings):
    settings.STUDIO_APPROVAL_WEBHOOK_DETAIL = "full"
    conversation = make_conversation(alice, title="Release")
    due = waited(conversation, 61)
    webhook_tick()
    (post,) = hook.wait_for(1)
    link = f"https://studio.example/c/{conversation.pk}/#approval-{due.approval_id}"
    assert (post["arguments_summary"], post["conversation"]) == ("make deploy", "Release")
    assert post["text"] == (
        f"alice's terminal call in `Release` has waited for a decision since "
        f"{due.requested_at:%H:%M} UTC: `make deploy` — {link}"
    )


def test_a_models_words_cannot_mention_or_link_in_the_chat_tool(hook, alice, settings):
    settings.STUDIO_APPROVAL_WEBHOOK_DETAIL = "full"
    conversation = make_conversation(alice, title="<!channel> @here [win](https://evil.example)")
    due = waited(conversation, 61)
    ToolApproval.objects.filter(pk=due.pk).update(
        subject="echo <!here> @channel <https://evil.example|click> & `x`\n@all"
    )
    webhook_tick()
    (post,) = hook.wait_for(1)
    text = post["text"]
    for markup in ("<!channel>", "<!here>", "<https://", "@here", "@channel", "@all", "& "):
        assert markup not in text, markup
    assert "&lt;!channel&gt; @\u200bhere" in text and "&amp;" in text
    # The title and the arguments sit in code spans (no links, no markdown),
    # each whole: a backtick of the model's cannot close one early.
    assert text.count("`") == 4
    assert "`&lt;!channel&gt; @\u200bhere [win](https://evil.example)`" in text


def test_not_fired_when_decided_before_the_delay(hook, alice, conversation):
    row = waited(conversation, 30)
    approval_decide(approval_id=row.approval_id, user=alice, decision="allow")
    ToolApproval.objects.filter(pk=row.pk).update(requested_at=timezone.now() - timedelta(hours=1))
    assert webhook_tick() == 0
    assert hook.posts == [] and ToolApproval.objects.get(pk=row.pk).webhook_at is None


def test_off_without_a_url(settings, conversation):
    settings.STUDIO_APPROVAL_WEBHOOK_URL = ""
    waited(conversation, 3600)
    assert webhook_claim_due() == []


def test_retried_on_failure_then_sent(hook, conversation):
    hook.fail_first = 2
    row = waited(conversation, 61)
    assert webhook_post(row) == "sent (attempt 3)"
    assert [p["approval_id"] for p in hook.posts] == [row.approval_id] * 3


def test_gives_up_after_the_attempts_and_logs_it(hook, conversation, caplog):
    hook.fail_first = 99
    row = waited(conversation, 61)
    delays: list[float] = []
    result = webhook_post(row, sleep=delays.append)
    assert result == "failed after 3 attempt(s): HTTP 500"
    assert ToolApproval.objects.get(pk=row.pk).webhook_result == result
    assert len(hook.posts) == 3 and delays == [0, 0]
    assert "failed after 3 attempt(s)" in caplog.text


def test_the_backoff_grows(hook, conversation, settings):
    settings.STUDIO_APPROVAL_WEBHOOK_BACKOFF = 2
    hook.fail_first = 99
    delays: list[float] = []
    webhook_post(waited(conversation, 61), sleep=delays.append)
    assert delays == [2, 6]


def test_a_hanging_receiver_blocks_nothing(hook, alice, conversation):
    hook.release.clear()  # every POST hangs until the test lets it go
    row = waited(conversation, 61)
    other = make_approval(conversation)
    assert webhook_tick() == 1  # returned: the POST runs on the webhook pool
    hook.wait_for(1)  # ...and is stuck in the receiver now
    # Meanwhile decisions (and so the runs waiting on them) go on.
    assert approval_decide(approval_id=other.approval_id, user=alice, decision="allow").resolved
    assert ToolApproval.objects.get(pk=row.pk).webhook_result == ""
    hook.release.set()
    assert settled(row) == "sent (attempt 1)"


def test_two_processes_claim_a_row_once(hook, conversation):
    rows = [waited(conversation, 61) for _ in range(10)]
    barrier = threading.Barrier(4, timeout=BOUND)
    claimed: list[list[int]] = []
    lock = threading.Lock()

    def claim() -> None:
        barrier.wait()
        try:
            mine = [a.pk for a in webhook_claim_due()]
            with lock:
                claimed.append(mine)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    every = sorted(pk for mine in claimed for pk in mine)
    assert every == sorted(r.pk for r in rows)  # each row once, by one claimer

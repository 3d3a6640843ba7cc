"""The approvals inbox: the page, the header count, and the live member sockets."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.consumers import MemberSocket
from approvals.inbox import notifications_set
from approvals.models import InboxPreference
from approvals.services.decisions import approval_decide
from approvals.services.rules import Verdict
from approvals.services.waiting import approval_request
from tests.factories import make_approval, make_conversation, make_reviewer, make_user
from tests.helpers.sockets import BOUND, closed_with, open_socket, receive_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]

COUNT = re.compile(r'id="approvals-count"[^>]*data-pending-count="(\d+)"')
ENTRY = re.compile(r'data-inbox-entry="([^"]+)"')


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def count_in(html: str) -> int:
    return int(COUNT.findall(html)[-1])


def ago(minutes: int):
    return timezone.now() - timedelta(minutes=minutes)


def test_the_inbox_lists_what_waits_for_the_member_newest_first(alice, bob):
    first = make_conversation(alice, title="Budget")
    second = make_conversation(alice, title="Deploy")
    older = make_approval(first, requested_at=ago(10))
    newer = make_approval(second, tool_name="terminal", arguments={"command": "ls"})
    make_approval(first, status="denied", reason="user")  # decided: not listed
    make_approval(make_conversation(bob))  # someone else's: not listed
    page = client_for(alice).get(reverse("approvals:inbox"))
    html = page.content.decode()
    assert ENTRY.findall(html) == [newer.approval_id, older.approval_id]
    entry = html.split(f'data-inbox-entry="{older.approval_id}"')[1].split("</section>")[0]
    assert f'href="/c/{first.pk}/#approval-{older.approval_id}"' in entry
    assert ">Budget</a>" in entry and "asked by alice" in entry
    assert "for 10\xa0minutes</time>" in entry
    assert f'data-approval-id="{older.approval_id}" data-status="pending"' in entry
    assert 'value="allow"' in entry  # decided in place, like in the chat
    assert count_in(html) == 2
    assert "<title>(2) Approvals" in html


def test_the_header_count_is_on_every_page_and_hidden_at_zero(alice, conversation):
    html = client_for(alice).get("/").content.decode()
    assert re.search(r'data-pending-count="0"[^>]*hidden', html)
    assert "<title>Conversations" in html
    make_approval(conversation)
    html = client_for(alice).get(conversation.get_absolute_url()).content.decode()
    assert count_in(html) == 1 and "<title>(1) " in html


def test_the_header_counts_only_the_calls_this_person_can_settle(alice):
    """Issue 37: a member's own call waiting for a reviewer counted as theirs to decide."""
    from approvals.inbox import inbox_count

    reviewer = make_reviewer("rita")
    conversation = make_conversation(alice)
    make_approval(conversation, needs_review=True)  # waits for rita, not for alice
    assert (inbox_count(alice), inbox_count(reviewer)) == (0, 1)
    make_approval(conversation)  # alice's own decision to make
    assert (inbox_count(alice), inbox_count(reviewer)) == (1, 1)
    # Alice's inbox still lists her call that waits for a reviewer (she may deny it).
    html = client_for(alice).get(reverse("approvals:inbox")).content.decode()
    assert html.count('class="inbox-entry') == 2 and count_in(html) == 1


def test_a_reviewer_sees_others_review_calls_with_the_buttons(alice):
    reviewer = make_reviewer("rita")
    conversation = make_conversation(alice, title="Prod")
    review = make_approval(conversation, needs_review=True)
    make_approval(conversation)  # alice's ordinary call: hers alone
    own = make_approval(make_conversation(reviewer), needs_review=True, requested_at=ago(5))
    html = client_for(reviewer).get(reverse("approvals:inbox")).content.decode()
    assert ENTRY.findall(html) == [review.approval_id, own.approval_id]
    theirs = html.split(f'data-inbox-entry="{review.approval_id}"')[1].split("</section>")[0]
    assert "Waiting for your review" in theirs and 'value="allow"' in theirs
    mine = html.split(f'data-inbox-entry="{own.approval_id}"')[1].split("</section>")[0]
    assert 'value="allow"' not in mine and 'value="deny"' in mine  # not their own call
    # The member's inbox holds both of hers; the review call without Allow.
    html = client_for(alice).get(reverse("approvals:inbox")).content.decode()
    assert len(ENTRY.findall(html)) == 2 and "Waiting for a reviewer" in html


def test_the_notification_switch_is_stored_and_needs_csrf(alice):
    client = client_for(alice)
    assert client.post(reverse("approvals:notifications"), {"notify": "on"}).status_code == 302
    assert InboxPreference.objects.get(user=alice).notify is True
    assert 'id="notify-toggle" checked' in client.get(reverse("approvals:inbox")).content.decode()
    client.post(reverse("approvals:notifications"), {})
    assert InboxPreference.objects.get(user=alice).notify is False
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(reverse("approvals:notifications"), {"notify": "on"}).status_code == 403
    assert InboxPreference.objects.get(user=alice).notify is False
    assert Client().get(reverse("approvals:inbox")).status_code == 302  # login first


# --- live ------------------------------------------------------------------------------


def ask(conversation, *, review: bool = False):
    verdict = Verdict("review" if review else "ask")
    return approval_request(
        conversation=conversation,
        tool_name="python",
        arguments={"code": "print(1)"},
        run_id="run-1",
        requested_by=conversation.owner,
        verdict=verdict,
    )


@pytest.mark.asyncio
async def test_the_inbox_socket_adds_and_removes_cards_live(alice, stop_runtime):
    conversation = await sync_to_async(make_conversation)(alice, title="Live")
    comm, connected, _ = await open_socket(0, alice, path="/ws/inbox/")
    assert connected
    state = await receive_until(comm, 'id="inbox-list"')
    assert count_in(state) == 0 and not ENTRY.findall(state)
    approval = await sync_to_async(ask)(conversation)
    added = await receive_until(comm, 'hx-swap-oob="afterbegin"')
    assert ENTRY.findall(added) == [approval.approval_id] and count_in(added) == 1
    assert "inbox-notify" not in added  # notifications are opt-in
    await sync_to_async(approval_decide)(
        approval_id=approval.approval_id, user=alice, decision="deny"
    )
    # In its place, for a moment, what became of it (studio.js removes it).
    removed = await receive_until(comm, "data-decided")
    assert f'id="inbox-entry-{approval.approval_id}"' in removed and count_in(removed) == 0
    assert 'role="status"' in removed and "Denied by alice" in removed
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_reviewers_sockets_get_review_calls_and_notifications(alice, stop_runtime):
    reviewer = await sync_to_async(make_reviewer)("rita")
    await sync_to_async(notifications_set)(reviewer, on=True)
    conversation = await sync_to_async(make_conversation)(alice, title="Prod")
    inbox, _, _ = await open_socket(0, reviewer, path="/ws/inbox/")
    page, _, _ = await open_socket(0, reviewer, path="/ws/me/")  # any other page
    await receive_until(inbox, 'id="inbox-list"')
    first = await receive_until(page, "approvals-count")
    assert "inbox-list" not in first
    await sync_to_async(ask)(conversation)  # an ordinary call: not theirs
    review = await sync_to_async(ask)(conversation, review=True)
    added = await receive_until(inbox, 'hx-swap-oob="afterbegin"')
    assert ENTRY.findall(added) == [review.approval_id] and count_in(added) == 1
    assert 'value="allow"' in added
    notify = await receive_until(page, 'id="inbox-notify"')
    assert "python call waits for your review" in notify and "“Prod” — asked by alice" in notify
    assert count_in(notify) == 1 and "inbox-list" not in notify
    await sync_to_async(approval_decide)(
        approval_id=review.approval_id, user=reviewer, decision="allow"
    )
    assert count_in(await receive_until(page, 'data-pending-count="0"')) == 0
    await inbox.disconnect()
    await page.disconnect()


@pytest.mark.asyncio
async def test_a_member_socket_closes_when_the_session_ends(alice, stop_runtime):
    client = await sync_to_async(client_for)(alice)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    comm, connected, _ = await open_socket(0, alice, cookie=cookie, path="/ws/me/")
    await receive_until(comm, "approvals-count")
    await sync_to_async(client.post)("/accounts/logout/")
    await closed_with(comm, 4401)
    anonymous, _, _ = await open_socket(0, path="/ws/inbox/")
    await closed_with(anonymous, 4401)


@pytest.mark.asyncio
async def test_the_chat_socket_keeps_the_count_too(alice, stop_runtime):
    conversation = await sync_to_async(make_conversation)(alice)
    other = await sync_to_async(make_conversation)(alice)
    comm, _, _ = await open_socket(conversation.pk, alice)
    assert count_in(await receive_until(comm, "approvals-count")) == 0
    await sync_to_async(ask)(other)  # a card in another of her chats
    assert count_in(await receive_until(comm, 'data-pending-count="1"')) == 1
    await comm.disconnect()
    stranger = await sync_to_async(make_user)("mallory")
    await sync_to_async(ask)(other)
    theirs, _, _ = await open_socket(0, stranger, path="/ws/me/")
    assert count_in(await receive_until(theirs, "approvals-count")) == 0
    await theirs.disconnect()


@pytest.mark.asyncio
async def test_a_page_sends_one_count_for_a_burst_of_changes(alice, stop_runtime, monkeypatch):
    """Three cards asked and one decided before the count settles: one count
    query and one frame, notifying the newest card that still waits."""
    seen, all_seen, settled = [], asyncio.Event(), asyncio.Event()
    changed = MemberSocket.inbox_changed

    async def counting(self, event):
        await changed(self, event)
        seen.append(event)
        if len(seen) == 4:
            all_seen.set()

    async def settle(self):
        await asyncio.wait_for(settled.wait(), BOUND)

    monkeypatch.setattr(MemberSocket, "inbox_changed", counting)
    monkeypatch.setattr(MemberSocket, "settle", settle)
    await sync_to_async(notifications_set)(alice, on=True)
    conversation = await sync_to_async(make_conversation)(alice, title="Burst")
    page, _, _ = await open_socket(0, alice, path="/ws/me/")
    assert count_in(await receive_until(page, "approvals-count")) == 0
    first = await sync_to_async(ask)(conversation)
    second = await sync_to_async(ask)(conversation)
    third = await sync_to_async(ask)(conversation)
    await sync_to_async(approval_decide)(approval_id=third.approval_id, user=alice, decision="deny")
    await asyncio.wait_for(all_seen.wait(), BOUND)
    settled.set()
    frame = await page.receive_from(timeout=BOUND)
    assert count_in(frame) == 2
    assert f'data-approval-id="{second.approval_id}"' in frame
    assert first.approval_id not in frame and third.approval_id not in frame
    assert await page.receive_nothing(timeout=0.5)
    await page.disconnect()

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ToolApproval, ToolRule
from chat.models import Conversation, Message
from tests.factories import make_approval, make_conversation

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["chat:index"])
def test_login_is_required(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_login_page_is_public(client):
    assert client.get(reverse("login")).status_code == 200


def test_index_lists_only_my_conversations_newest_first(alice_client, alice, bob):
    older = make_conversation(alice, title="Older")
    newer = make_conversation(alice, title="Newer")
    make_conversation(bob, title="Bob's secret")
    html = alice_client.get(reverse("chat:index")).content.decode()
    assert html.index("Newer") < html.index("Older")
    assert "Bob&#x27;s secret" not in html and "Bob's secret" not in html
    assert older.get_absolute_url() in html and newer.get_absolute_url() in html


def test_new_chat(alice_client, alice):
    response = alice_client.post(reverse("chat:new"))
    conversation = Conversation.objects.get(owner=alice)
    assert response["Location"] == conversation.get_absolute_url()
    assert conversation.confirm_tool_calls is True


def test_new_chat_again_and_again_keeps_one_blank_chat(alice_client, alice, bob):
    """Issue 37: empty "New chat" conversations piled up in the list."""
    first = alice_client.post(reverse("chat:new"))["Location"]
    assert alice_client.post(reverse("chat:new"))["Location"] == first
    assert Conversation.objects.filter(owner=alice).count() == 1
    # Once written in, it is a chat of its own: the next New chat is another one.
    Message.objects.create(conversation=Conversation.objects.get(owner=alice), role="user")
    assert alice_client.post(reverse("chat:new"))["Location"] != first
    assert Conversation.objects.filter(owner=alice).count() == 2
    # Someone else's blank chat is never handed out.
    theirs = make_conversation(bob)
    assert alice_client.post(reverse("chat:new"))["Location"] != theirs.get_absolute_url()


def test_other_members_conversation_is_404(alice_client, bob):
    theirs = make_conversation(bob)
    assert alice_client.get(theirs.get_absolute_url()).status_code == 404
    assert alice_client.post(reverse("chat:settings", args=[theirs.pk]), {}).status_code == 404
    assert alice_client.post(reverse("chat:stop", args=[theirs.pk])).status_code == 404
    assert alice_client.post(reverse("chat:retry", args=[theirs.pk])).status_code == 404
    assert (
        alice_client.post(reverse("chat:send", args=[theirs.pk]), {"message": "x"}).status_code
        == 404
    )
    assert not theirs.messages.exists()


def test_page_renders_history_with_live_and_decided_cards(alice_client, conversation, alice):
    Message.objects.create(conversation=conversation, role="user", content="please run it")
    pending = make_approval(conversation, tool_call_id="c1")
    denied = make_approval(
        conversation,
        tool_call_id="c2",
        arguments={"code": "import os"},
        status="denied",
        reason="user",
        decided_by=alice,
        note="too risky",
    )
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="Running.",
        tool_calls=[
            {"id": "c1", "name": "python", "arguments": pending.arguments},
            {"id": "c2", "name": "python", "arguments": denied.arguments},
        ],
    )
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert "please run it" in html
    live = html.split(f'data-approval-id="{pending.approval_id}"')[1].split("</article>")[0]
    assert 'data-status="pending"' in html and 'value="allow"' in live
    decided = html.split(f'data-approval-id="{denied.approval_id}"')[1].split("</article>")[0]
    assert "Denied by alice" in decided and "too risky" in decided
    assert 'value="allow"' not in decided
    assert re.search(rf'ws-connect="/ws/c/{conversation.pk}/\?since=\d+"', html)
    assert "csrfmiddlewaretoken" in html  # plain forms work before any script runs


def test_settings_update_and_rule_revoke(alice_client, conversation, alice):
    url = reverse("chat:settings", args=[conversation.pk])
    response = alice_client.post(
        url, {"enabled_tools": ["python", "bogus"]}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200 and 'id="settings"' in response.content.decode()
    conversation.refresh_from_db()
    assert conversation.confirm_tool_calls is False
    assert conversation.enabled_tools == ["python"]
    grant = ToolRule.objects.create(
        tool="python", action="allow", scope="conversation", conversation=conversation
    )
    revoke = reverse("chat:rule_revoke", args=[conversation.pk, grant.pk])
    assert alice_client.post(revoke).status_code == 302
    grant.refresh_from_db()
    assert grant.revoked_at is not None and grant.revoked_by == alice
    assert alice_client.post(revoke).status_code == 404  # already revoked


def test_rules_of_other_conversations_cannot_be_revoked(alice_client, alice, bob):
    mine = make_conversation(alice)
    theirs = make_conversation(bob)
    grant = ToolRule.objects.create(
        tool="python", action="allow", scope="conversation", conversation=theirs
    )
    response = alice_client.post(reverse("chat:rule_revoke", args=[mine.pk, grant.pk]))
    assert response.status_code == 404
    grant.refresh_from_db()
    assert grant.revoked_at is None


def test_posts_need_csrf(alice, conversation):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post(reverse("chat:settings", args=[conversation.pk]), {}).status_code == 403
    assert client.post(reverse("chat:new")).status_code == 403


def test_the_page_offers_retry_only_after_an_error(alice_client, conversation):
    Message.objects.create(conversation=conversation, role="user", content="hi")
    assert 'id="retry-button"' not in alice_client.get(conversation.get_absolute_url()).text
    response = alice_client.post(reverse("chat:retry", args=[conversation.pk]), follow=True)
    assert "There is nothing to retry." in response.text
    Message.objects.create(conversation=conversation, role="error", content="The model is down.")
    assert 'id="retry-button"' in alice_client.get(conversation.get_absolute_url()).text


def test_a_long_message_folds_and_keeps_every_character(alice_client, conversation):
    import html
    import re

    text = "\n".join(f"line {n} " + "x" * 50 for n in range(300))
    Message.objects.create(conversation=conversation, role="user", content=text)
    Message.objects.create(conversation=conversation, role="user", content="short one")
    page = alice_client.get(conversation.get_absolute_url()).text
    assert page.count('<details class="fold">') == 1
    assert "Show all of it (300 lines, " in page
    parts = [html.unescape(p) for p in re.findall(r'<p class="user-text">(.*?)</p>', page, re.S)]
    assert parts[0] + parts[1] == text and parts[0].count("\n") < 10
    assert parts[2] == "short one"


def test_the_page_offers_regenerate_after_a_reply_and_edit_on_the_branch_only(
    alice_client, conversation
):
    from django.utils import timezone

    page = alice_client.get(conversation.get_absolute_url()).text
    assert 'id="regenerate-button"' not in page  # nothing asked yet
    old = Message.objects.create(
        conversation=conversation, role="user", content="old", superseded_at=timezone.now()
    )
    new = Message.objects.create(conversation=conversation, role="user", content="new")
    Message.objects.create(conversation=conversation, role="assistant", content="an answer")
    page = alice_client.get(conversation.get_absolute_url()).text
    assert 'id="regenerate-button"' in page
    assert "Earlier version · 1 message," in page
    assert f'name="message_id" value="{new.pk}"' in page
    assert f'name="message_id" value="{old.pk}"' not in page  # replaced: read only


def test_edit_and_regenerate_refuse_bad_input_and_others(alice_client, conversation, bob):
    said = Message.objects.create(conversation=conversation, role="user", content="hi")
    url = reverse("chat:edit", args=[conversation.pk])
    assert alice_client.post(url, {"message_id": "x", "message": "a"}).status_code == 400
    response = alice_client.post(url, {"message_id": said.pk, "message": "y" * 100_001})
    assert response.status_code == 400 and "limited to" in response.text
    response = alice_client.post(url, {"message_id": said.pk + 99, "message": "a"}, follow=True)
    assert "That message was replaced meanwhile" in response.text
    theirs = make_conversation(bob)
    for name in ("chat:edit", "chat:regenerate"):
        data = {"message_id": said.pk, "message": "a"}
        assert alice_client.post(reverse(name, args=[theirs.pk]), data).status_code == 404
    assert Message.objects.get(pk=said.pk).superseded_at is None


def bob_client(bob):
    client = Client()
    client.force_login(bob)
    return client


def test_a_shared_chat_reads_read_only_to_the_team_and_stops_when_unshared(
    alice_client, alice, bob
):
    from tests.factories import make_run

    chat = make_conversation(alice, title="Deploy notes")
    run = make_run(chat, status="waiting")
    Message.objects.create(conversation=chat, role="user", content="How do we deploy?")
    calls = [
        {"id": call, "name": "terminal", "arguments": {"command": command}}
        for call, command in (("c1", "rm -rf build"), ("c2", "make deploy"))
    ]
    Message.objects.create(
        conversation=chat, run=run, role="assistant", content="Let me.", tool_calls=calls
    )
    for call in calls:
        command = call["arguments"]["command"]
        make_approval(chat, run_id=str(run.pk), tool_call_id=call["id"], tool_name="terminal",
                      arguments=call["arguments"], subject=command)  # fmt: skip
    ToolApproval.objects.filter(tool_call_id="c1").update(
        status="denied", reason="user", decided_by=alice
    )
    url = reverse("chat:conversation", args=[chat.pk])
    teammate = bob_client(bob)
    assert teammate.get(url).status_code == 404

    shared = alice_client.post(reverse("chat:share", args=[chat.pk]), {"share": "1"})
    assert shared.status_code == 302
    chat.refresh_from_db()
    assert chat.shared_at is not None
    page = teammate.get(url)
    html = page.content.decode()
    assert page.status_code == 200 and "shared with the team" in html
    assert "How do we deploy?" in html and "Denied by alice" in html and "make deploy" in html
    assert '<span class="who">alice</span>' in html  # whose words, not "You"
    # Read, never change: no buttons, no composer, no settings, no edit.
    for absent in ('value="allow"', 'value="deny"', 'id="composer"', "Stop sharing", "edit-"):
        assert absent not in html, absent
    for name in ("chat:send", "chat:share", "chat:settings", "chat:stop", "chat:delete"):
        assert teammate.post(reverse(name, args=[chat.pk]), {"share": "0"}).status_code == 404
    index = teammate.get(reverse("chat:index")).content.decode()
    assert "Shared by your team" in index and "Deploy notes" in index
    # Its owner's own page is as before, with the switch.
    assert "Stop sharing" in alice_client.get(url).content.decode()

    unshared = alice_client.post(reverse("chat:share", args=[chat.pk]), {"share": "0"})
    assert unshared.status_code == 302
    assert teammate.get(url).status_code == 404
    assert "Deploy notes" not in teammate.get(reverse("chat:index")).content.decode()


def test_sharing_takes_a_plain_yes_or_no_and_ends_with_the_chat(alice_client, alice, bob):
    chat = make_conversation(alice)
    share = reverse("chat:share", args=[chat.pk])
    assert alice_client.post(share, {"share": "maybe"}).status_code == 400
    assert alice_client.get(share).status_code == 405
    alice_client.post(share, {"share": "1"})
    Conversation.objects.filter(pk=chat.pk).update(deleted_at=chat.created_at)
    assert bob_client(bob).get(reverse("chat:conversation", args=[chat.pk])).status_code == 404


def test_the_admin_lists_what_is_shared(admin_client, alice):
    shared = make_conversation(alice, title="Open book")
    make_conversation(alice, title="Private diary")
    Conversation.objects.filter(pk=shared.pk).update(shared_at=shared.created_at)
    page = admin_client.get("/admin/chat/conversation/?shared=yes").content.decode()
    assert "Open book" in page and "Private diary" not in page

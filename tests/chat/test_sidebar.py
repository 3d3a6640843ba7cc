"""The sidebar's conversations: list, search, rename, archive and delete."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule
from chat import display
from chat.models import Conversation, Message, Run
from chat.render import waiting_markers
from chat.services import (
    RunBusy,
    conversation_delete,
    conversation_list,
    conversation_start,
    run_create,
)
from tests.factories import make_approval, make_conversation, make_run
from tests.helpers.races import run_together

pytestmark = pytest.mark.django_db


def said(conversation, text: str, role: str = Message.Role.USER) -> Message:
    return Message.objects.create(conversation=conversation, role=role, content=text)


def titles(owner, **kwargs) -> list[str]:
    return [c.title for c in conversation_list(owner=owner, **kwargs)]


# -- the list and its search ----------------------------------------------------------


def test_the_list_is_mine_newest_activity_first_without_archived_or_deleted(alice, bob):
    old = make_conversation(alice, title="Old")
    make_conversation(alice, title="New")
    make_conversation(alice, title="Put away", archived_at=timezone.now())
    make_conversation(alice, title="Gone", deleted_at=timezone.now())
    make_conversation(bob, title="Bob's")
    Conversation.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=1))
    assert titles(alice) == ["New", "Old"]
    assert titles(alice, archived=True) == ["Put away"]


@pytest.mark.anydb
def test_search_reads_titles_and_words_said_never_tool_output(alice, bob):
    """On PostgreSQL (the services pass) through full-text search, on SQLite by substring."""
    by_title = make_conversation(alice, title="Quarterly python report")
    by_user = make_conversation(alice, title="Untitled one")
    said(by_user, "Please load the Pythonic dataset and plot revenue")
    by_reply = make_conversation(alice, title="Untitled two")
    said(by_reply, "Here is the python answer about revenue", Message.Role.ASSISTANT)
    in_tool = make_conversation(alice, title="Untitled three")
    said(in_tool, "python traceback revenue", Message.Role.TOOL)
    make_conversation(bob, title="python for bob")

    found = set(titles(alice, query="pyth"))
    assert found == {by_title.title, by_user.title, by_reply.title}
    # Every word must match, each as the start of a word.
    assert set(titles(alice, query="python revenue")) == {by_user.title, by_reply.title}
    inside_words = set(titles(alice, query="ython"))
    if connection.vendor == "postgresql":
        assert inside_words == set()  # full-text search matches a word's start
    else:
        assert inside_words == found  # SQLite's substring match finds it anywhere
    assert titles(alice, query="nothing-like-it") == []
    # Punctuation and operators are only separators, never a query error.
    assert set(titles(alice, query="pyth & | ! ' :*(")) == found


def test_search_and_archive_switch_through_the_list_view(alice_client, alice):
    make_conversation(alice, title="Budget sheet")
    make_conversation(alice, title="Trip plans")
    make_conversation(alice, title="Budget 2025", archived_at=timezone.now())
    html = alice_client.get(reverse("chat:list"), {"q": "budget"}).content.decode()
    assert "Budget sheet" in html and "Trip plans" not in html and "Budget 2025" not in html
    html = alice_client.get(reverse("chat:list"), {"q": "budget", "archived": "1"}).content.decode()
    assert "Budget 2025" in html and "Budget sheet" not in html
    html = alice_client.get(reverse("chat:list"), {"q": "zzz"}).content.decode()
    assert "No chat matches" in html
    # The index page searches the same way without any script.
    html = alice_client.get(reverse("chat:index"), {"q": "trip"}).content.decode()
    assert "Trip plans" in html and "Budget sheet" not in html


def test_the_chat_page_shows_the_sidebar_with_the_open_chat_current(alice_client, alice):
    other = make_conversation(alice, title="Another chat")
    here = make_conversation(alice, title="This chat")
    html = alice_client.get(here.get_absolute_url()).content.decode()
    assert 'id="sidebar"' in html and other.get_absolute_url() in html
    assert f'href="{here.get_absolute_url()}" aria-current="page"' in html


def test_a_chat_with_a_waiting_call_carries_a_marker_and_its_update(alice, bob):
    waiting = make_conversation(alice, title="Waits")
    calm = make_conversation(alice, title="Calm")
    approval = make_approval(waiting)
    listed = {c.pk: c.waiting for c in conversation_list(owner=alice)}
    assert listed == {waiting.pk: True, calm.pk: False}
    # A live update names only the chats the changed calls belong to.
    html = waiting_markers(display.waiting(alice, approval_ids=[approval.approval_id]))
    assert f'id="waiting-{waiting.pk}"' in html and f"waiting-{calm.pk}" not in html
    assert "hidden" not in html and 'hx-swap-oob="true"' in html
    ToolApproval.objects.filter(pk=approval.pk).update(status=ToolApproval.Status.DENIED)
    assert "hidden" in waiting_markers(display.waiting(alice, approval_ids=[approval.approval_id]))
    # Nobody learns of another member's chats this way.
    assert waiting_markers(display.waiting(bob, approval_ids=[approval.approval_id])) == ""


# -- rename and archive ---------------------------------------------------------------


def test_rename_keeps_the_list_order_and_refuses_a_blank_or_long_name(alice_client, alice):
    conversation = make_conversation(alice, title="Before")
    before = Conversation.objects.get(pk=conversation.pk).updated_at
    url = reverse("chat:rename", args=[conversation.pk])
    response = alice_client.post(
        url, {"title": "  After \n all ", "current": conversation.pk}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert '<h1 id="conversation-title" hx-swap-oob="true">After all</h1>' in html
    renamed = Conversation.objects.get(pk=conversation.pk)
    assert renamed.title == "After all" and renamed.updated_at == before

    for title, reason in [("   ", "Give the chat a name."), ("x" * 201, "limited to 200")]:
        response = alice_client.post(url, {"title": title}, HTTP_HX_REQUEST="true")
        assert response.status_code == 400 and reason in response.content.decode()
    assert Conversation.objects.get(pk=conversation.pk).title == "After all"


def test_others_and_unknown_chats_are_404_and_unchanged(alice_client, bob):
    theirs = make_conversation(bob, title="Bob's")
    for name, data in [
        ("chat:rename", {"title": "Mine now"}),
        ("chat:archive", {"archive": "1"}),
        ("chat:delete", {"confirm": "yes"}),
    ]:
        assert alice_client.post(reverse(name, args=[theirs.pk]), data).status_code == 404
        assert alice_client.post(reverse(name, args=[999_999]), data).status_code == 404
    theirs = Conversation.objects.get(pk=theirs.pk)
    assert (theirs.title, theirs.archived_at, theirs.deleted_at) == ("Bob's", None, None)


def test_archive_hides_a_chat_until_unarchived_or_written_in(alice_client, alice):
    conversation = make_conversation(alice, title="Put away")
    url = reverse("chat:archive", args=[conversation.pk])
    assert alice_client.post(url, {"archive": "maybe"}).status_code == 400
    response = alice_client.post(url, {"archive": "1"})
    assert response.status_code == 302 and response["Location"] == reverse("chat:index")
    assert titles(alice) == []
    # Still opens, says it is archived, and offers the way back.
    html = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert "Archived" in html and "Unarchive" in html
    run, _ = run_create(
        run_id="00000000-0000-0000-0000-000000000001",
        conversation_id=conversation.pk,
        user=alice,
        text="back to it",
        owner="",
    )
    assert titles(alice) == ["Put away"]


# -- delete ---------------------------------------------------------------------------


def test_delete_removes_the_chat_and_keeps_its_audit(
    alice_client, alice, tmp_path, settings, django_capture_on_commit_callbacks
):
    settings.STUDIO_WORKSPACE_ROOT = tmp_path
    conversation = make_conversation(alice, title="Secret plans")
    said(conversation, "the plan")
    run = make_run(conversation, status=Run.Status.DONE)
    approval = make_approval(conversation, run_id=str(run.pk), status=ToolApproval.Status.ALLOWED)
    rule = ToolRule.objects.create(
        tool="python",
        action=ToolRule.Action.ALLOW,
        scope=ToolRule.Scope.CONVERSATION,
        conversation=conversation,
        member=alice,
    )
    conversation.workspace.mkdir()
    (conversation.workspace / "data.csv").write_text("1,2")

    url = reverse("chat:delete", args=[conversation.pk])
    response = alice_client.post(url, {}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "confirm" in response.content.decode()
    assert Message.objects.filter(conversation=conversation).exists()

    with django_capture_on_commit_callbacks(execute=True):
        response = alice_client.post(
            url, {"confirm": "yes", "current": conversation.pk}, HTTP_HX_REQUEST="true"
        )
    assert response.status_code == 200 and response["HX-Redirect"] == reverse("chat:index")
    assert not Message.objects.filter(conversation=conversation).exists()
    assert not Run.objects.filter(conversation=conversation).exists()
    assert not conversation.workspace.exists()
    assert ToolApproval.objects.get(pk=approval.pk).status == ToolApproval.Status.ALLOWED
    assert ToolRule.objects.get(pk=rule.pk).revoked_at is not None
    # Gone for its member everywhere, and never reused as a blank new chat.
    assert alice_client.get(conversation.get_absolute_url()).status_code == 404
    assert alice_client.post(url, {"confirm": "yes"}).status_code == 404
    assert "Secret plans" not in alice_client.get(reverse("chat:index")).content.decode()
    assert conversation_start(owner=alice).pk != conversation.pk
    with pytest.raises(Conversation.DoesNotExist):
        run_create(
            run_id="00000000-0000-0000-0000-000000000002",
            conversation_id=conversation.pk,
            user=alice,
            text="again",
            owner="",
        )


def test_a_chat_whose_run_goes_on_is_not_deleted(alice_client, alice):
    conversation = make_conversation(alice)
    said(conversation, "keep me")
    make_run(conversation)  # running: working or waiting on a call
    url = reverse("chat:delete", args=[conversation.pk])
    response = alice_client.post(url, {"confirm": "yes"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400 and "Stop it" in response.content.decode()
    assert Conversation.objects.get(pk=conversation.pk).deleted_at is None
    assert Message.objects.filter(conversation=conversation).count() == 1


def test_purge_removes_a_deleted_chat_once_its_last_approval_row_goes(alice):
    conversation = make_conversation(alice)
    approval = make_approval(conversation, status=ToolApproval.Status.ALLOWED)
    conversation_delete(conversation=conversation, user=alice)
    call_command("purge_approvals", verbosity=0)  # its row is young: both stay
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    ToolApproval.objects.filter(pk=approval.pk).update(
        decided_at=timezone.now() - timedelta(days=100)
    )
    call_command("purge_approvals", "--dry-run", verbosity=0)
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    call_command("purge_approvals", verbosity=0)
    assert not Conversation.objects.filter(pk=conversation.pk).exists()


def test_the_admin_cannot_delete_a_chat_and_its_audit(client, alice):
    from tests.factories import make_user

    staff = make_user("root", staff=True, superuser=True)
    conversation = make_conversation(alice)
    make_approval(conversation)
    client.force_login(staff)
    url = reverse("admin:chat_conversation_delete", args=[conversation.pk])
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.anydb
@pytest.mark.django_db(transaction=True)
def test_a_delete_and_a_message_racing_never_leave_a_message_in_a_deleted_chat(alice):
    """Threads released together: either the run starts and the delete is
    refused, or the delete wins and the message is refused. Never both."""
    outcomes = set()
    for round_ in range(15):
        conversation = make_conversation(alice)
        said(conversation, "first")

        def send(conversation=conversation, n=round_):
            return run_create(
                run_id=f"00000000-0000-0000-0000-{n:012d}",
                conversation_id=conversation.pk,
                user=alice,
                text="second",
                owner="",
            )

        def delete(conversation=conversation):
            conversation_delete(conversation=conversation, user=alice)
            return "deleted"

        sent, deleted = run_together([send, delete])
        conversation.refresh_from_db()
        messages = Message.objects.filter(conversation=conversation).count()
        if deleted == "deleted":
            assert isinstance(sent, (Conversation.DoesNotExist, RunBusy)), sent
            assert conversation.deleted_at is not None and messages == 0
            outcomes.add("delete won")
        else:
            assert isinstance(sent, tuple), sent
            assert "Stop it" in str(deleted)
            assert conversation.deleted_at is None and messages == 2
            Run.objects.filter(conversation=conversation).update(status=Run.Status.DONE)
            outcomes.add("message won")
    assert outcomes  # each round ended one of the two ways

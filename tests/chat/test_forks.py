"""Regenerate, and edit and resend: the chat forks; the old branch stays readable
and is never replayed; calls of the new branch are gated as usual.

Runs go through the real runtime with the demo model and the real sandbox, as
a socket starts them.
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from chat.display import Fold, transcript_items
from chat.models import Message, Run
from chat.runs.commands import run_edit, run_launch, run_regenerate
from chat.transcript import transcript_build
from tests.chat.test_engine import finished, until
from tests.factories import make_conversation, make_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.anydb]


def branch(conversation) -> list[tuple[str, str]]:
    """(role, content) of the messages the model reads now."""
    return [
        (m["role"], m["content"])
        for m in transcript_build(conversation, tools="")[1:]
        if m["role"] in ("user", "tool")
    ]


async def off(fn, **kwargs):
    from studio.runtime import runtime

    return await runtime().off_loop(fn, **kwargs)


async def until_pending(conversation) -> ToolApproval:
    def pending():
        return ToolApproval.objects.pending().filter(conversation=conversation).first()

    await until(lambda: pending() is not None)
    return await sync_to_async(pending)()


async def allowed_and_finished(conversation, alice) -> ToolApproval:
    approval = await until_pending(conversation)
    await sync_to_async(approval_decide)(
        approval_id=approval.approval_id, user=alice, decision="allow"
    )
    await until(lambda: finished(conversation))
    return approval


async def test_regenerate_gates_the_call_again_and_never_replays_the_old_one(rt, alice):
    conversation = await sync_to_async(make_conversation)(alice)
    launched = await off(
        run_launch, conversation_id=conversation.pk, user=alice, text="run python: print(6 * 7)"
    )
    assert launched.ok
    first = await allowed_and_finished(conversation, alice)

    again = await off(run_regenerate, conversation_id=conversation.pk, user=alice)
    assert again.ok, again
    # The same call is asked again: a new card, pending, nothing run yet.
    second = await until_pending(conversation)
    assert second.approval_id != first.approval_id and second.run_id == again.run_id
    runs_of_python = await sync_to_async(
        lambda: Message.objects.filter(conversation=conversation, role="tool").count()
    )()
    assert runs_of_python == 1  # only the old branch's result so far
    await sync_to_async(approval_decide)(
        approval_id=second.approval_id, user=alice, decision="deny"
    )
    await until(lambda: finished(conversation))

    await sync_to_async(first.refresh_from_db)()
    assert first.status == "allowed"  # the old branch's row is kept as it was
    read = await sync_to_async(branch)(conversation)
    assert read == [
        ("user", "run python: print(6 * 7)"),
        ("tool", "The user declined to run this tool call."),
    ]
    items = await sync_to_async(transcript_items)(conversation)
    folds = [item for item in items if isinstance(item, Fold)]
    assert len(folds) == 1
    old = folds[0].folded
    assert [i.message.role for i in old] == ["assistant", "assistant"]
    assert old[0].tools[0].approval.approval_id == first.approval_id
    assert re.match(r"^42\s*$", old[0].tools[0].result.content)


async def test_edit_forks_at_a_message_and_gates_the_new_branch(rt, alice):
    conversation = await sync_to_async(make_conversation)(alice)
    assert (await off(run_launch, conversation_id=conversation.pk, user=alice, text="hello")).ok
    await until(lambda: finished(conversation))
    asked = await off(
        run_launch, conversation_id=conversation.pk, user=alice, text="run python: print(1)"
    )
    assert asked.ok
    await allowed_and_finished(conversation, alice)
    hello = await sync_to_async(
        Message.objects.filter(conversation=conversation, role="user").first
    )()

    edited = await off(
        run_edit,
        conversation_id=conversation.pk,
        user=alice,
        message_id=hello.pk,
        text="run python: print(2 + 3)",
    )
    assert edited.ok, edited
    approval = await allowed_and_finished(conversation, alice)
    assert approval.run_id == edited.run_id and approval.arguments == {"code": "print(2 + 3)"}
    read = await sync_to_async(branch)(conversation)
    assert read[0] == ("user", "run python: print(2 + 3)")
    assert re.match(r"^5\s*$", read[1][1]) and len(read) == 2
    # Everything from "hello" on is one earlier version, still readable.
    items = await sync_to_async(transcript_items)(conversation)
    assert isinstance(items[0], Fold)
    texts = [i.message.content for i in items[0].folded if i.message.role == "user"]
    assert texts == ["hello", "run python: print(1)"]

    # The replaced message can no longer be edited; a second edit of the new one
    # makes a second, separate fold.
    stale = await off(
        run_edit, conversation_id=conversation.pk, user=alice, message_id=hello.pk, text="x"
    )
    assert (stale.ok, stale.reason) == (False, "moved")
    newest = await sync_to_async(
        Message.objects.filter(conversation=conversation, role="user", superseded_at=None).get
    )()
    assert (
        await off(
            run_edit,
            conversation_id=conversation.pk,
            user=alice,
            message_id=newest.pk,
            text="hello again",
        )
    ).ok
    await until(lambda: finished(conversation))
    items = await sync_to_async(transcript_items)(conversation)
    assert [type(i).__name__ for i in items[:2]] == ["Fold", "Fold"]  # side by side


async def test_refusals_change_nothing(rt, alice, bob):
    conversation = await sync_to_async(make_conversation)(alice)
    nothing = await off(run_regenerate, conversation_id=conversation.pk, user=alice)
    assert (nothing.ok, nothing.reason) == (False, "unasked")

    said = await sync_to_async(Message.objects.create)(
        conversation=conversation, role="user", content="first"
    )
    await sync_to_async(make_run)(conversation)  # a run goes on
    busy = await off(
        run_edit, conversation_id=conversation.pk, user=alice, message_id=said.pk, text="other"
    )
    assert (busy.ok, busy.reason) == (False, "running")
    assert (
        await sync_to_async(
            Message.objects.filter(conversation=conversation, superseded_at=None).count
        )()
        == 1
    )
    await sync_to_async(Run.objects.filter(conversation=conversation).update)(status="done")

    # Someone else's message, a reply (not a member's message), or empty text.
    theirs = await sync_to_async(make_conversation)(bob)
    their_said = await sync_to_async(Message.objects.create)(
        conversation=theirs, role="user", content="bob's"
    )
    reply = await sync_to_async(Message.objects.create)(
        conversation=conversation, role="assistant", content="a reply"
    )
    for message_id, text, reason in [
        (their_said.pk, "mine now", "moved"),
        (reply.pk, "rewritten", "moved"),
        (said.pk, "   ", "empty"),
    ]:
        refused = await off(
            run_edit, conversation_id=conversation.pk, user=alice, message_id=message_id, text=text
        )
        assert (refused.ok, refused.reason) == (False, reason)
    assert not await sync_to_async(Message.objects.filter(superseded_at__isnull=False).exists)()

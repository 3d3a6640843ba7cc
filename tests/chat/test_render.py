"""The chat's fragments draw what ``chat.display`` read, and read nothing more.

Issue 54: ``chat/render.py`` read the database (the settings panel's rules,
the run controls' Retry, the sidebar's markers), so a fragment's cost and
its statements hid in the drawing. Each test reads first, then counts the
statements the drawing alone makes: none.
"""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.template.loader import render_to_string
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from approvals.inbox import inbox_count
from approvals.models import ToolApproval, ToolRule
from chat import display, render
from chat.models import Message
from chat.workspace import workspace_upload
from tests.factories import make_approval, make_conversation, make_reviewer, make_run
from tests.test_imports import ROOT, imports_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(alice, bob, workspace_root):
    """A chat with a bit of everything its page shows: a reply with a decided
    call and its result, a call that waits, an error, a rule, a file, a
    teammate's decision and an earlier version folded by an edit."""
    conversation = make_conversation(alice, title="Everything")
    run = make_run(conversation)
    Message.objects.create(conversation=conversation, role="user", content="first ask")
    calls = [
        {"id": "call-1", "name": "python", "arguments": {"code": "print(1)"}},
        {"id": "call-2", "name": "bash", "arguments": {"command": "ls"}},
    ]
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="Let me look.",
        tool_calls=calls,
        run=run,
        model_name="demo",
    )
    make_approval(
        conversation,
        run_id=str(run.pk),
        tool_call_id="call-1",
        status=ToolApproval.Status.ALLOWED,
        reason=ToolApproval.Reason.USER,
        decided_by=bob,
        note="fine",
    )
    Message.objects.create(
        conversation=conversation, role="tool", content="1", tool_call_id="call-1", run=run
    )
    make_approval(
        conversation,
        tool_name="bash",
        arguments={"command": "ls"},
        run_id=str(run.pk),
        tool_call_id="call-2",
    )
    Message.objects.create(conversation=conversation, role="error", content="It broke.")
    ToolRule.objects.create(
        tool="python", pattern="print*", action="allow", scope="conversation",
        conversation=conversation, created_by=alice,
    )  # fmt: skip
    ToolRule.objects.create(
        tool="bash", pattern="ls", action="allow", scope="member", member=alice, created_by=alice
    )
    ToolRule.objects.create(tool="bash", pattern="rm *", action="deny", scope="everyone")
    workspace_upload(conversation, [SimpleUploadedFile("notes.txt", b"hello")])
    make_conversation(alice, title="Another")
    return conversation


def _drawn_without_statements(draw) -> str:
    with CaptureQueriesContext(connection) as drawn:
        html = draw()
    assert [q["sql"] for q in drawn.captured_queries] == []
    return html


def test_the_page_draws_from_what_was_read(chat, alice):
    request = RequestFactory().get(chat.get_absolute_url())
    request.user = alice
    # The header's count is the layout's (its context processor reads it when drawn).
    context = {**display.page_context(chat), "inbox_count": inbox_count(alice)}
    html = _drawn_without_statements(
        lambda: render_to_string("chat/conversation.html", context, request=request)
    )
    assert "Let me look." in html and "It broke." in html and "print*" in html


def test_a_tabs_catch_up_draws_from_what_was_read(chat, alice):
    items = display.transcript_items(chat)
    controls = display.run_controls(chat, running=False)
    panel = display.settings_context(chat)
    markers = display.waiting(alice)
    frames = _drawn_without_statements(
        lambda: (
            render.catch_up(chat, items, controls=controls, panel=panel)
            + [render.waiting_markers(markers)]
        )
    )
    assert "Let me look." in frames[0] and 'id="run-controls"' in frames[0]


def test_the_panels_draw_from_what_was_read(chat):
    panel = display.settings_context(chat)
    files = display.files_context(chat)
    html = _drawn_without_statements(
        lambda: render.settings_panel(panel, oob=True) + render.files_panel(files, oob=True)
    )
    assert "print*" in html and "notes.txt" in html


def test_a_reviewers_page_draws_from_what_was_read(chat):
    context = display.review_context(chat, viewer=make_reviewer("carol"))
    html = _drawn_without_statements(lambda: render_to_string("chat/conversation.html", context))
    assert "Let me look." in html


def test_render_imports_nothing_that_reads():
    """The rule that keeps it so: no service, workspace, MCP or model client,
    no ORM, and no manager named in its source."""
    path = ROOT / "chat" / "render.py"
    readers = ("chat.services", "chat.workspace", "chat.mcp", "chat.llm", "approvals.services")
    imported = {m for m in imports_of(path) if m.startswith((*readers, "django.db"))}
    assert imported == set()
    assert ".objects" not in path.read_text()

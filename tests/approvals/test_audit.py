"""The audit's depth: timings, output, the decision's origin; exports and the archive."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import uuid
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals import export
from approvals.export import FIELDS, approval_from_record, approval_record
from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from approvals.services.waiting import approval_record_output
from chat.events import ToolStarted
from tests.factories import make_approval, make_run
from tests.helpers.driver import AgentDriver
from tests.helpers.scripted import ScriptedModel, call

pytestmark = pytest.mark.django_db(transaction=True)
RUN_ID = str(uuid.uuid4())


def client_for(user, **defaults) -> Client:
    client = Client(**defaults)
    client.force_login(user)
    return client


def test_a_decision_records_its_origin_and_how_long_it_took(conversation, alice):
    row = make_approval(conversation, requested_at=timezone.now() - timedelta(seconds=42))
    client = client_for(alice, REMOTE_ADDR="203.0.113.7", HTTP_USER_AGENT="Firefox/140 (test)")
    assert (
        client.post(
            reverse("approvals:decide", args=[row.approval_id]), {"decision": "allow"}
        ).status_code
        == 302
    )
    row.refresh_from_db()
    assert (row.decided_ip, row.decided_user_agent) == ("203.0.113.7", "Firefox/140 (test)")
    assert 42 <= row.decision_seconds < 60


@pytest.mark.parametrize(("https", "expected"), [(False, "10.0.0.9"), (True, "198.51.100.4")])
def test_the_proxys_word_counts_only_when_trusted(conversation, alice, settings, https, expected):
    settings.STUDIO_HTTPS = https
    row = make_approval(conversation)
    client = client_for(alice, REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.4")
    client.post(
        reverse("approvals:decide", args=[row.approval_id]),
        {"decision": "deny"},
        secure=https,
    )
    row.refresh_from_db()
    assert row.decided_ip == expected


def test_the_summary_is_the_first_64_kb_and_size_and_hash_cover_everything(conversation):
    row = make_approval(conversation)
    text = "é" * 40000 + "end"  # 80,003 bytes: the cut falls inside no character
    approval_record_output(approval=row, text=text, seconds=1.5, outcome="ok")
    row.refresh_from_db()
    data = text.encode()
    assert (row.output_size, row.output_sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert row.output_summary == "é" * 32768 and row.run_seconds == 1.5


def test_the_row_keeps_the_tools_output_and_run_time(conversation, alice):
    code = "print('x' * 5000); print('end')"
    turns = [("", [call("python", {"code": code})]), ("Done.", [])]
    driver = AgentDriver.scripted(conversation, alice, turns)
    started = driver.wait_for(ToolStarted)
    approval_decide(approval_id=started.approval_id, user=alice, decision="allow")
    driver.finish()
    row = ToolApproval.objects.get(approval_id=started.approval_id)
    output = "x" * 5000 + "\nend\n"
    assert row.output_size == len(output.encode())
    assert row.output_sha256 == hashlib.sha256(output.encode()).hexdigest()
    assert row.output_summary == output
    assert row.run_seconds is not None and row.run_seconds > 0


def test_automatic_rows_took_no_time_to_decide(conversation):
    conversation.confirm_tool_calls = False
    conversation.save()
    model = ScriptedModel([("", [call("python", {"code": "print(1)"})]), ("Done.", [])])
    driver = AgentDriver.start(conversation=conversation, model=model, user=conversation.owner,
                               run=make_run(conversation))  # fmt: skip
    driver.finish()
    row = ToolApproval.objects.get()
    assert (row.decision_seconds, row.output_summary) == (0.0, "1\n")


# --- exports and the archive ---------------------------------------------------------------


def full_row(conversation, alice, run_id: str = RUN_ID, **extra) -> ToolApproval:
    """A row with every field set to something (so a lost field shows)."""
    now = timezone.now().replace(microsecond=123456)
    return make_approval(
        conversation,
        arguments={"code": "print('é')"},
        approved_arguments={"code": "print(2)"},
        approved_sha256="b" * 64,
        subject="print('é')",
        tool_hints=["read-only"],
        tool_schema={"type": "object"},
        status="allowed",
        reason="edited",
        decided_by=alice,
        decided_at=now - timedelta(days=120),
        requested_at=now - timedelta(days=120, seconds=5),
        note="fine",
        run_id=run_id,
        tool_call_id="call-1",
        rule_snapshot={"tool": "python", "pattern": "", "action": "allow", "scope": "member"},
        needs_review=True,
        expires_at=now - timedelta(days=117),
        started_at=now - timedelta(days=120),
        webhook_at=now,
        webhook_result="sent (attempt 1)",
        decision_seconds=5.25,
        run_seconds=0.5,
        output_summary="2\n",
        output_size=2,
        output_sha256="c" * 64,
        decided_ip="2001:db8::1",
        decided_user_agent="curl/8",
        **extra,
    )


def same_fields(a: ToolApproval, b: ToolApproval) -> list[str]:
    return [f.attname for f in FIELDS if f.value_from_object(a) != f.value_from_object(b)]


def test_the_archive_round_trips_every_field(conversation, alice, tmp_path):
    rows = [full_row(conversation, alice) for _ in range(3)]
    keep = make_approval(conversation, status="allowed", reason="user",
                         decided_at=timezone.now())  # fmt: skip
    archive = tmp_path / "approvals.jsonl"
    out = io.StringIO()
    call_command("purge_approvals", "--older-than", "90", "--archive", str(archive), stdout=out)
    assert "Archived 3 decided approval(s)" in out.getvalue()
    assert list(ToolApproval.objects.values_list("pk", flat=True)) == [keep.pk]
    records = [json.loads(line) for line in archive.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [r.pk for r in rows]
    for original, record in zip(rows, records, strict=True):
        assert set(record) == {f.attname for f in FIELDS}
        assert same_fields(original, approval_from_record(record)) == []
    assert oct(archive.stat().st_mode & 0o777) == "0o600"  # audit data
    # A second purge appends to the same archive.
    full_row(conversation, alice)
    call_command("purge_approvals", "--older-than", "90", "--archive", str(archive), stdout=out)
    assert len(archive.read_text(encoding="utf-8").splitlines()) == 4


@pytest.mark.parametrize("fault", ["missing-folder", "a-directory", "disk-full"])
def test_an_archive_that_cannot_be_written_deletes_nothing(
    conversation, alice, tmp_path, monkeypatch, fault
):
    rows = [full_row(conversation, alice) for _ in range(2)]
    folder = tmp_path / "archives"
    folder.mkdir()
    archive = folder / "approvals.jsonl"
    if fault == "missing-folder":
        archive = tmp_path / "nope" / "approvals.jsonl"
    elif fault == "a-directory":
        archive.mkdir()
    else:
        archive.write_text('{"earlier": true}\n')

        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(export.os, "fsync", full)
    with pytest.raises(CommandError, match="Could not write the archive"):
        call_command("purge_approvals", "--older-than", "90", "--archive", str(archive))
    assert ToolApproval.objects.filter(pk__in=[r.pk for r in rows]).count() == 2
    if fault == "disk-full":
        assert archive.read_text() == '{"earlier": true}\n'  # untouched
        assert os.listdir(folder) == ["approvals.jsonl"]  # no temporary left behind


def test_the_admin_exports_json_lines_with_every_field(conversation, alice, admin_user):
    row = full_row(conversation, alice)
    response = client_for(admin_user).post(
        reverse("admin:approvals_toolapproval_changelist"),
        {"action": "export_jsonl", "_selected_action": [row.pk]},
    )
    assert response["Content-Type"].startswith("application/x-ndjson")
    (line,) = b"".join(response.streaming_content).decode().splitlines()
    assert json.loads(line) == approval_record(ToolApproval.objects.get(pk=row.pk))
    assert same_fields(row, approval_from_record(json.loads(line))) == []


def test_the_detail_page_shows_the_context(conversation, alice, admin_user):
    from chat.models import Message

    run = make_run(conversation, status="done")
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="I will print the accent.",
        run=run,
        tool_calls=[{"id": "call-1", "name": "python", "arguments": {"code": "print('é')"}}],
    )
    row = full_row(conversation, alice, run_id=str(run.pk))
    html = (
        client_for(admin_user)
        .get(reverse("admin:approvals_toolapproval_change", args=[row.pk]))
        .content.decode()
    )
    assert "I will print the accent." in html  # the message that asked
    assert "&quot;code&quot;: &quot;print(2)&quot;" in html  # approved, pretty-printed
    assert "2001:db8::1" in html and "curl/8" in html and "5.2 s" in html  # in units

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ToolApproval
from tests.factories import make_approval

pytestmark = pytest.mark.django_db


def purge(*args: str) -> str:
    out = StringIO()
    call_command("purge_approvals", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def aged(conversation, settings):
    settings.STUDIO_APPROVAL_TIMEOUT = 3600
    now = timezone.now()
    return {
        "fresh_pending": make_approval(conversation),
        "stale_pending": make_approval(conversation, requested_at=now - timedelta(hours=2)),
        "recent_decided": make_approval(
            conversation, status="allowed", reason="user", decided_at=now - timedelta(days=3)
        ),
        "old_decided": make_approval(
            conversation,
            status="denied",
            reason="user",
            requested_at=now - timedelta(days=100),
            decided_at=now - timedelta(days=100),
        ),
    }


def state(row: ToolApproval) -> tuple[str, str] | None:
    row = ToolApproval.objects.filter(pk=row.pk).first()
    return None if row is None else (row.status, row.reason)


def test_dry_run_changes_nothing(aged):
    before = {name: state(row) for name, row in aged.items()}
    out = purge("--dry-run")
    assert "Would expire 1 pending approval(s) older than 1 hour;" in out
    assert "would delete 1 decided" in out
    assert {name: state(row) for name, row in aged.items()} == before


def test_expires_stale_pending_and_deletes_old_decided(aged):
    out = purge()
    assert "Expired 1 pending" in out and "deleted 1 decided" in out
    assert state(aged["stale_pending"]) == ("denied", "expired")
    assert state(aged["fresh_pending"]) == ("pending", "")
    assert state(aged["recent_decided"]) == ("allowed", "user")
    assert state(aged["old_decided"]) is None


def test_is_idempotent(aged):
    purge()
    out = purge()
    assert "Expired 0 pending" in out and "deleted 0 decided" in out


def test_thresholds_are_options(aged):
    purge("--expire-pending-older-than", "0", "--older-than", "1")
    assert state(aged["fresh_pending"]) == ("denied", "expired")
    assert state(aged["recent_decided"]) is None


def test_quiet_at_verbosity_0(aged):
    out = StringIO()
    call_command("purge_approvals", verbosity=0, stdout=out)
    assert out.getvalue() == ""


def _queries_for(conversation, n: int) -> int:
    ToolApproval.objects.all().delete()
    old = timezone.now() - timedelta(days=200)
    ToolApproval.objects.bulk_create(
        [
            ToolApproval(
                conversation=conversation,
                tool_name="python",
                arguments={"i": i},
                arguments_sha256="0" * 64,
                status="pending" if i % 2 else "allowed",
                reason="" if i % 2 else "user",
                requested_at=old,
                decided_at=None if i % 2 else old,
            )
            for i in range(n)
        ]
    )
    with CaptureQueriesContext(connection) as ctx:
        purge()
    assert ToolApproval.objects.pending().count() == 0
    assert ToolApproval.objects.count() == n // 2
    return len(ctx.captured_queries)


def test_query_count_is_flat(conversation):
    assert _queries_for(conversation, 10) == _queries_for(conversation, 1000)


# --- open tabs see expired cards -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_cards_expired_by_purge_change_in_open_tabs(conversation, alice):
    from datetime import timedelta

    from asgiref.sync import sync_to_async
    from django.test import Client
    from django.utils import timezone

    from tests.factories import make_run
    from tests.helpers.sockets import open_socket

    @sync_to_async
    def setup() -> tuple[str, str]:
        from chat.models import Message

        client = Client()
        client.force_login(alice)
        # A card on the page: the assistant turn that asked, and its approval.
        run = make_run(conversation, status="done")
        requested_at = timezone.now() - timedelta(days=4)
        arguments = {"code": "print(1 + 1)"}
        Message.objects.create(
            conversation=conversation,
            run=run,
            role="assistant",
            tool_calls=[{"id": "c1", "name": "python", "arguments": arguments}],
        )
        approval = make_approval(
            conversation, run_id=str(run.pk), tool_call_id="c1", requested_at=requested_at
        )
        return client.cookies["sessionid"].value, approval.approval_id

    session, approval_id = await setup()
    comm, connected, _ = await open_socket(conversation.pk, cookie=f"sessionid={session}")
    assert connected
    assert 'data-status="pending"' in await comm.receive_from(timeout=10)
    await sync_to_async(call_command)("purge_approvals", stdout=StringIO())
    frame = await comm.receive_from(timeout=10)
    assert f'data-approval-id="{approval_id}"' in frame
    assert 'data-status="denied"' in frame and "Expired" in frame
    await comm.disconnect()


def test_the_summary_says_ages_as_people_do(conversation, settings):
    settings.STUDIO_APPROVAL_TIMEOUT = 259200
    assert "older than 3 days;" in purge("--dry-run")
    settings.STUDIO_APPROVAL_TIMEOUT = 90
    assert "older than 90 s;" in purge("--dry-run")

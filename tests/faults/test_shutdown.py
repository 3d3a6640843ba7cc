"""SIGTERM while runs wait for decisions: the process exits in seconds, its runs untouched."""

from __future__ import annotations

import signal
import time

import pytest

from approvals.models import ToolApproval
from chat.models import Run
from tests.factories import make_conversation
from tests.helpers.clients import Tab, session_cookie
from tests.helpers.live import LiveServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]


def test_sigterm_with_waiting_runs_exits_promptly_and_leaves_them_waiting(
    alice, workspace_root, tmp_path
):
    server = LiveServer(
        log_path=tmp_path / "daphne.log", STUDIO_WORKSPACE_ROOT=str(workspace_root)
    ).start()
    session = session_cookie(alice)
    conversations = [make_conversation(alice) for _ in range(3)]
    tabs = []
    try:
        for conversation in conversations:
            tab = Tab(server.ws_url, conversation.pk, session, origin=server.url)
            tab.until('id="transcript"')
            tab.send("run python: print(1)")
            tab.until('data-status="pending"')
            tabs.append(tab)
        deadline = time.monotonic() + 20
        while Run.objects.exclude(owner="").exists():  # each lets its run go right after the card
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert ToolApproval.objects.pending().count() == 3
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(10)
        took = time.monotonic() - started
    finally:
        for tab in tabs:
            tab.ws.close()
        server.stop()
    assert took < 6, f"the process took {took:.1f} s to exit"
    # Waiting runs belong to no process: a restart leaves them as they were.
    rows = list(ToolApproval.objects.values_list("status", "reason"))
    assert rows == [("pending", "")] * 3
    assert {run.state for run in Run.objects.all()} == {"waiting"}

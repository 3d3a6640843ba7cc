"""A run parked through a real daphne process's socket, as a member's tab parks it."""

from __future__ import annotations

from chat.models import Run
from tests.helpers.clients import APPROVAL_ID, Tab
from tests.helpers.procs import until


def park_a_run(server, conversation, session, code: str = "print(6 * 7)") -> tuple[Tab, str]:
    """Ask for a python call in a tab of ``server``; the tab and the call's approval id."""
    tab = Tab(server.ws_url, conversation.pk, session, origin=server.url)
    tab.until('id="transcript"')
    tab.send(f"run python: {code}")
    frames = tab.until('data-status="pending"')
    # The card is out just before the step lets the run go: wait for that.
    until(lambda: run_of(conversation).state == "waiting", "the run's wait")
    return tab, APPROVAL_ID.findall(frames)[-1]


def run_of(conversation) -> Run:
    return Run.objects.get(conversation=conversation)

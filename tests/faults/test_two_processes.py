"""Faults with real processes: two daphnes on PostgreSQL and a Redis of our own."""

from __future__ import annotations

import subprocess
import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command

from approvals.models import ToolApproval
from chat.models import Run
from tests.factories import make_approval
from tests.helpers.clients import APPROVAL_ID, Browserish, Tab, session_cookie
from tests.helpers.live import free_port, two_servers

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

BOUND = 30


class PrivateRedis:
    """A redis-server only this test uses, so restarting it disturbs nobody."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "yes",
            ],
            check=True,
            capture_output=True,
        )
        self._wait(up=True)

    def stop(self) -> None:
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True
        )
        self._wait(up=False)

    def _wait(self, *, up: bool) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ok = (
                subprocess.run(
                    ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
                ).stdout.strip()
                == "PONG"
            )
            if ok == up:
                return
            time.sleep(0.05)
        raise AssertionError(f"redis on {self.port} did not go {'up' if up else 'down'}")


@pytest.fixture
def redis_server():
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cluster(redis_server, workspace_root, tmp_path):
    env = {
        "REDIS_URL": redis_server.url,
        "STUDIO_WORKSPACE_ROOT": str(workspace_root),
        "STUDIO_APPROVAL_POLL_SECONDS": "1",
        "STUDIO_RUN_HEARTBEAT_SECONDS": "0.5",
        "STUDIO_RUN_STALE_SECONDS": "2",
        "STUDIO_LAYER_WATCH_SECONDS": "0.5",
    }
    with two_servers(tmp_path, **env) as pair:
        yield pair


def park_a_run(server, conversation, session) -> tuple[Tab, str]:
    tab = Tab(server.ws_url, conversation.pk, session, origin=server.url)
    tab.until('id="transcript"')
    tab.send("run python: print(6 * 7)")
    frames = tab.until('data-status="pending"')
    return tab, APPROVAL_ID.findall(frames)[-1]


def test_kill_9_while_runs_wait(cluster, conversation, alice, settings):
    a, b = cluster
    settings.STUDIO_RUN_STALE_SECONDS = 2
    session = session_cookie(alice)
    tab, approval_id = park_a_run(a, conversation, session)
    a.kill()
    tab.ws.close()

    # The other process keeps serving: the page, with the orphaned card.
    page = Browserish(b.url, session)
    html = page.http.get(conversation.get_absolute_url()).text
    assert approval_id in html

    # Once the dead process's heartbeat is stale, purge leaves nothing pending.
    deadline = time.monotonic() + BOUND
    while ToolApproval.objects.filter(approval_id=approval_id, status="pending").exists():
        assert time.monotonic() < deadline, "purge never expired the orphaned approval"
        call_command("purge_approvals", stdout=StringIO())
        time.sleep(0.5)
    row = ToolApproval.objects.get(approval_id=approval_id)
    assert (row.status, row.reason) == ("denied", "expired")
    assert not ToolApproval.objects.pending().exists()
    assert Run.objects.get(conversation=conversation).status == "error"

    # ...and the conversation works again on the surviving process.
    tab_b, new_id = park_a_run(b, conversation, session)
    assert page.decide(new_id, "allow").status_code == 200
    tab_b.until('<pre class="output">42')
    tab_b.close()
    page.close()


def test_redis_restart_while_a_run_waits(cluster, redis_server, conversation, alice):
    a, b = cluster
    session = session_cookie(alice)
    tab, approval_id = park_a_run(a, conversation, session)
    redis_server.stop()
    redis_server.start()
    # Decided in the other process: the wake message may be lost with the
    # restart; the waiter's poll of the row must still pick it up.
    page = Browserish(b.url, session)
    mark = tab.mark()
    response = page.decide(approval_id, "allow")
    assert response.status_code == 200 and response.json()["resolved"] is True
    # The tab on process A recovers (reconnected or re-joined its group after
    # the restart) and shows the result and the finished run.
    tab.until('<pre class="output">42', since=mark)
    tab.until('data-running="false"', since=mark)
    assert Run.objects.get(conversation=conversation).status == "done"
    tab.close()
    page.close()


def test_16_decision_posts_over_two_processes(cluster, conversation, alice):
    a, b = cluster
    session = session_cookie(alice)
    approval = make_approval(conversation)
    pages = [Browserish(server.url, session) for server in (a, b) for _ in range(8)]
    for page in pages:
        page.csrf()
    barrier = threading.Barrier(len(pages), timeout=BOUND)
    codes: list[int] = []
    lock = threading.Lock()

    def post(page: Browserish, decision: str) -> None:
        barrier.wait()
        code = page.decide(approval.approval_id, decision).status_code
        with lock:
            codes.append(code)

    threads = [
        threading.Thread(target=post, args=(p, "allow" if i % 2 else "deny"))
        for i, p in enumerate(pages)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert sorted(codes) == [200] + [409] * 15
    row = ToolApproval.objects.get(pk=approval.pk)
    assert row.status in ("allowed", "denied") and row.decided_by == alice
    for page in pages:
        page.close()

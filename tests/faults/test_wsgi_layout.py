"""Channels' second layout: HTTP under gunicorn, daphne for the sockets only.

A decision recorded in a WSGI worker (no loop of its own) must still reach
every tab and let its run go on in a daphne process: its card and the run's
hand-over leave through the worker's outbox thread and Redis.
"""

from __future__ import annotations

import pytest

from chat.models import Run
from deploy.cluster import DaphneProcess
from tests.factories import make_conversation
from tests.helpers.clients import Browserish, session_cookie
from tests.helpers.live import LiveServer
from tests.helpers.procs import child_env
from tests.helpers.runs import park_a_run, run_of
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_decision_through_gunicorn_reaches_the_tab_and_its_run_goes_on_in_daphne(
    alice, redis_server, workspace_root, tmp_path
):
    env = cluster_env(redis_server.url, workspace_root)
    sockets = LiveServer(log_path=tmp_path / "daphne.log", **env).start()
    http = None
    try:
        http = DaphneProcess(
            env=child_env(**env),
            app="studio.wsgi:application",
            server="gunicorn",
            log_path=tmp_path / "gunicorn.log",
        ).start(timeout=60)
        conversation = make_conversation(alice)
        session = session_cookie(alice)
        tab, approval_id = park_a_run(sockets, conversation, session)

        page = Browserish(http.url, session)
        try:
            mark = tab.mark()
            response = page.decide(approval_id, "allow")
            assert response.status_code == 200 and response.json()["resolved"] is True
            # The card, sent from the worker, then the result of the run that
            # a daphne process took over from the shared channel.
            tab.until(f'data-approval-id="{approval_id}" data-status="allowed"', since=mark)
            tab.until('<pre class="output">42', since=mark)
            tab.until('data-running="false"', since=mark)
        finally:
            page.close()
            tab.close()
        assert run_of(conversation).status == Run.Status.DONE
    finally:
        if http is not None:
            http.stop()
        sockets.stop()

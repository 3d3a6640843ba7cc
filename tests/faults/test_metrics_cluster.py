"""Metrics across two processes: a scrape reaching either one reports them all."""

from __future__ import annotations

import httpx
import pytest

from approvals.models import ToolApproval
from tests.factories import make_approval
from tests.helpers.clients import Browserish, session_cookie
from tests.helpers.live import two_servers
from tests.helpers.services import cluster_env
from tests.test_operations import sample

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TOKEN = "cluster-scrape-token"


def test_a_scrape_of_either_process_adds_up_every_process(
    redis_server, workspace_root, tmp_path, conversation, alice
):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {
        **cluster_env(redis_server.url, workspace_root),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "STUDIO_HEALTH_TOKEN": TOKEN,
    }
    approvals = [make_approval(conversation) for _ in range(5)]
    session = session_cookie(alice)
    with two_servers(tmp_path, **env) as (a, b):
        # Two decisions through A, one through B.
        for server, approval in zip((a, a, b), approvals, strict=False):
            page = Browserish(server.url, session)
            assert page.decide(approval.approval_id, "allow").status_code == 200
            page.close()
        waiting = ToolApproval.objects.pending().count()
        assert waiting == 2
        for server in (a, b):
            reply = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            assert reply.status_code == 200
            text = reply.text
            decided = sample(
                text, "studio_decision_seconds_count", tool="python", outcome="allowed"
            )
            assert decided == 3, f"{server.url} reported {decided}"
            assert sample(text, "studio_calls_waiting", tool="python", for_reviewer="false") == 2
            ready = httpx.get(f"{server.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
            assert ready.status_code == 200, ready.text

"""deploy/prometheus.yml and its alerts, proven: Debian's Prometheus scrapes
Studio through nginx (TLS, the bearer token) in front of two processes."""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from approvals.models import ToolApproval
from deploy.cluster import free_port
from deploy.proxy import LocalNginx
from tests.factories import make_approval
from tests.helpers.live import two_servers
from tests.helpers.procs import ROOT, until
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

TOKEN = "prometheus-scrape-token"
BOUND = 30.0


def prometheus_config(target: str, ca_file: Path, token_file: Path, folder: Path) -> Path:
    """The shipped files in ``folder``, pointed at this test's nginx, evaluated every second."""
    text = (ROOT / "deploy" / "prometheus.yml").read_text()
    for old, new in [
        ("scrape_interval: 30s", "scrape_interval: 1s"),
        ("evaluation_interval: 30s", "evaluation_interval: 1s"),
        ("/etc/prometheus/studio-health-token", str(token_file)),
        (
            "# tls_config: {ca_file: /etc/prometheus/studio-ca.pem}",
            f"tls_config: {{ca_file: {ca_file}}}",
        ),
        ('["studio.example.com"]', f'["{target}"]'),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    config = folder / "prometheus.yml"
    config.write_text(text)
    shutil.copy(ROOT / "deploy" / "prometheus-alerts.yml", folder / "studio-alerts.yml")
    return config


def test_each_shipped_alert_fires_when_it_should_and_not_before():
    """promtool's unit tests of the rules (prometheus_alerts_test.yml): series
    in, alerts and their texts out, at given times."""
    for check in (
        ["check", "rules", str(ROOT / "deploy" / "prometheus-alerts.yml")],
        ["test", "rules", str(Path(__file__).with_name("prometheus_alerts_test.yml"))],
    ):
        done = subprocess.run(["promtool", *check], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_through_nginx_and_alerts_on_a_call_left_waiting(
    redis_server, workspace_root, tmp_path, conversation
):
    for _ in range(2):
        make_approval(conversation)
    old = make_approval(conversation)
    ToolApproval.objects.filter(pk=old.pk).update(requested_at=timezone.now() - timedelta(hours=2))
    make_approval(conversation, status=ToolApproval.Status.ALLOWED)
    waiting = ToolApproval.objects.pending().count()
    assert waiting == 3
    env = {
        **cluster_env(redis_server.url, workspace_root),
        "STUDIO_HTTPS": "True",
        "STUDIO_HEALTH_TOKEN": TOKEN,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    (tmp_path / "metrics").mkdir()
    for folder in ("nginx", "static", "prometheus", "tsdb"):
        (tmp_path / folder).mkdir()
    token_file = tmp_path / "prometheus" / "token"
    token_file.write_text(TOKEN + "\n")
    with two_servers(tmp_path, **env) as (a, b):
        proxy = LocalNginx(tmp_path / "nginx", [a.port, b.port], tmp_path / "static").start()
        port = free_port()
        config = prometheus_config(
            f"127.0.0.1:{proxy.port}",
            tmp_path / "nginx" / "cert.pem",
            token_file,
            tmp_path / "prometheus",
        )
        checked = subprocess.run(
            ["promtool", "check", "config", str(config)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        log = (tmp_path / "prometheus.log").open("w")
        prometheus = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=5)

        def value(query: str) -> float | None:
            try:
                result = api.get("/query", params={"query": query}).json()["data"]["result"]
            except (httpx.HTTPError, KeyError, ValueError):
                return None  # not up yet
            return float(result[0]["value"][1]) if result else None

        def alert(name: str) -> dict | None:
            try:
                alerts = api.get("/alerts").json()["data"]["alerts"]
            except (httpx.HTTPError, KeyError, ValueError):
                return None
            return next((a for a in alerts if a["labels"]["alertname"] == name), None)

        try:
            until(lambda: value('up{job="studio"}') == 1, "the scrape through nginx as up")
            assert until(lambda: value("sum(studio_calls_waiting)"), "calls waiting") == waiting
            assert value("studio_oldest_waiting_call_age_seconds") > 7000
            # The shipped rule holds 5 minutes before it fires: pending here.
            assert until(lambda: alert("StudioCallWaitingLong"), "the alert on the old call")[
                "state"
            ] in ("pending", "firing")
            assert alert("StudioDown") is None
        finally:
            prometheus.terminate()
            prometheus.wait(timeout=BOUND)
            log.close()
            api.close()
            proxy.stop()
    assert " /metrics " in proxy.access_log and TOKEN not in proxy.access_log

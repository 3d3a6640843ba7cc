"""Operating Studio: health for load balancers, metrics for monitoring, logs that join up."""

from __future__ import annotations

import json
import logging
import re

import pytest
from django.test import Client

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from tests.factories import make_approval, make_conversation, make_user

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "s3cret-token-for-monitoring"


@pytest.fixture
def token(settings):
    settings.STUDIO_HEALTH_TOKEN = TOKEN
    return TOKEN


def staff_client() -> Client:
    client = Client()
    client.force_login(make_user("ops", staff=True))
    return client


def member_client() -> Client:
    client = Client()
    client.force_login(make_user("mia"))
    return client


# --- health ---------------------------------------------------------------------------


def test_liveness_is_public_and_touches_no_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        response = Client().get("/healthz")
    assert response.status_code == 200 and response.content == b"ok\n"
    assert "no-cache" in response["Cache-Control"]


def test_readiness_tells_anyone_the_status_and_only_operators_the_details(token, settings):
    settings.STUDIO_SANDBOX = "none"
    anonymous = Client().get("/readyz")
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}
    assert member_client().get("/readyz").json() == {"status": "ok"}
    assert Client().get("/readyz", HTTP_AUTHORIZATION="Bearer wrong").json() == {"status": "ok"}
    for answer in (
        staff_client().get("/readyz"),
        Client().get("/readyz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"),
    ):
        checks = answer.json()["checks"]
        assert set(checks) == {"database", "migrations", "channel_layer", "sandbox"}
        assert all(check["ok"] for check in checks.values()), checks


def test_readiness_fails_with_a_503_naming_what_is_missing(token, settings, monkeypatch):
    settings.STUDIO_SANDBOX = "bwrap"
    monkeypatch.setenv("PATH", "/nonexistent")  # no bwrap to be found
    assert Client().get("/readyz").status_code == 503
    answer = Client().get("/readyz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 503 and answer.json()["status"] == "unavailable"
    sandbox = answer.json()["checks"]["sandbox"]
    assert not sandbox["ok"] and "bwrap" in sandbox["detail"]
    assert answer.json()["checks"]["database"]["ok"]


def test_health_answers_only_get():
    assert Client().post("/healthz").status_code == 405


# --- metrics --------------------------------------------------------------------------


def sample(text: str, name: str, **labels) -> float | None:
    """The value of one sample of the exposition ``text`` (None if absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and found == {k: str(v) for k, v in labels.items()}:
            return float(value)
    return None


def test_metrics_are_for_operators_only(token):
    assert Client().get("/metrics").status_code == 403
    assert member_client().get("/metrics").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
    assert staff_client().get("/metrics").status_code == 200


def test_a_token_that_is_not_ascii_is_refused_not_a_crash(token):
    """Issue 52: compare_digest raised TypeError on a non-ASCII str (a 500)."""
    for given in ("Bearer é-wrong", "Bearer \u3000", f"Bearer {TOKEN}é"):
        assert Client().get("/metrics", HTTP_AUTHORIZATION=given).status_code == 403
        answer = Client().get("/readyz", HTTP_AUTHORIZATION=given)
        assert answer.status_code == 200 and answer.json() == {"status": "ok"}


def test_waiting_calls_and_decisions_are_measured(token):
    owner = make_user("owen")
    conversation = make_conversation(owner)
    for _ in range(3):
        make_approval(conversation, tool_name="terminal", arguments={"command": "ls"})
    make_approval(conversation, tool_name="python", needs_review=True)
    decided = make_approval(conversation, tool_name="python")
    approval_decide(approval_id=decided.approval_id, user=owner, decision="allow")

    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    waiting = ToolApproval.objects.pending()
    assert sample(text, "studio_calls_waiting", tool="terminal", for_reviewer="false") == 3
    assert sample(text, "studio_calls_waiting", tool="python", for_reviewer="true") == 1
    assert (
        sum(
            sample(text, "studio_calls_waiting", tool=t, for_reviewer=r) or 0
            for t in ("terminal", "python")
            for r in ("true", "false")
        )
        == waiting.count()
    )
    assert sample(text, "studio_oldest_waiting_call_age_seconds") >= 0
    count = sample(text, "studio_decision_seconds_count", tool="python", outcome="allowed")
    assert count is not None and count >= 1
    assert sample(text, "studio_runs", state="waiting") == 0
    for name in ("studio_tool_call_seconds", "studio_model_request_seconds", "studio_rule_hits"):
        assert f"# TYPE {name}" in text


# --- logs -------------------------------------------------------------------------------


def test_a_decision_is_logged_with_its_ids_and_without_its_arguments(caplog, settings):
    settings.STUDIO_HTTPS = True  # behind the trusted proxy: its request id is kept
    owner = make_user("olga")
    conversation = make_conversation(owner)
    approval = make_approval(conversation, arguments={"code": "print('TOP-SECRET')"})
    client = Client()
    client.force_login(owner)
    with caplog.at_level(logging.INFO):
        response = client.post(
            f"/approvals/{approval.approval_id}/decide/",
            {"decision": "allow"},
            HTTP_X_REQUEST_ID="req-42",
            HTTP_ACCEPT="application/json",
            secure=True,
        )
    assert response.status_code == 200 and response["X-Request-ID"] == "req-42"
    [record] = [r for r in caplog.records if r.name == "approvals.services.decisions"]
    assert record.levelno == logging.INFO
    assert (record.request_id, record.user_id) == ("req-42", str(owner.pk))
    assert (record.approval_id, record.conversation_id) == (
        approval.approval_id,
        str(conversation.pk),
    )
    assert "TOP-SECRET" not in caplog.text


def test_a_request_id_from_an_untrusted_client_is_replaced(settings):
    settings.STUDIO_HTTPS = False
    response = Client().get("/accounts/login/", HTTP_X_REQUEST_ID="forged")
    assert re.fullmatch(r"[0-9a-f]{32}", response["X-Request-ID"])


def test_json_lines_carry_the_ids():
    from logging.config import dictConfig

    from django.conf import settings

    from studio.logs import log_context

    config = json.loads(json.dumps(settings.LOGGING))
    config["handlers"]["console"]["formatter"] = "json"
    dictConfig(config)
    try:
        handler = logging.getLogger().handlers[0]
        record = logging.LogRecord(
            "chat.runs.driver", logging.WARNING, __file__, 1, "hi %s", ("x",), None
        )
        with log_context(run_id="r-1", conversation_id=7):
            for f in handler.filters:
                f.filter(record)
        line = json.loads(handler.format(record))
    finally:
        dictConfig(settings.LOGGING)
    assert line["message"] == "hi x" and line["level"] == "WARNING"
    assert (line["run_id"], line["conversation_id"], line["approval_id"]) == ("r-1", "7", "")


def _asked_by(path: str) -> set[str]:
    """The metric names a shipped file's queries use."""
    from django.conf import settings

    text = (settings.BASE_DIR / "deploy" / path).read_text()
    if path.endswith(".json"):
        dashboard = json.loads(text)
        text = "\n".join(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
    else:  # the alert rules: their expressions, not their words
        text = "\n".join(re.findall(r"expr: (\|\n(?:\s{10}.*\n)+|.*)", text))
    return set(re.findall(r"\bstudio_\w+", text))


@pytest.mark.parametrize("path", ["grafana-dashboard.json", "prometheus-alerts.yml"])
def test_the_dashboard_and_alerts_ask_only_for_metrics_studio_serves(token, path):
    asked = _asked_by(path)
    text = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    served = set(re.findall(r"^# TYPE (studio_\w+) (\w+)", text, re.M))
    names = set()
    for name, kind in served:
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
        if kind == "counter":
            names |= {f"{name}_total"}
    assert asked and asked <= names, asked - names

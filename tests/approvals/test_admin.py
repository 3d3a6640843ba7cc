from __future__ import annotations

import csv
import io

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule, arguments_hash
from tests.factories import make_approval, make_conversation, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(admin_user) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def rows(alice, bob):
    a = make_conversation(alice, title="Budget analysis")
    b = make_conversation(bob, title="Server logs")
    allowed = make_approval(
        a,
        arguments={"code": "=SUM(A1)"},
        status="allowed",
        reason="user",
        decided_by=alice,
        decided_at=timezone.now(),
        note="-fine",
    )
    denied = make_approval(
        b,
        tool_name="terminal",
        arguments={"command": "rm -rf /tmp/x"},
        status="denied",
        reason="user",
        decided_by=bob,
        decided_at=timezone.now(),
    )
    pending = make_approval(a, tool_name="web_fetch", arguments={"url": "https://example.com"})
    return allowed, denied, pending


def test_changelist_renders_with_filters_and_search(staff_client, rows):
    changelist = reverse("admin:approvals_toolapproval_changelist")
    response = staff_client.get(changelist)
    assert response.status_code == 200
    html = response.content.decode()
    for label in ("By state", "By reason", "By tool name", "By requested at"):
        assert label in html
    headers = [str(column["text"]) for column in response.context["result_headers"]]
    assert headers[1:] == [
        "requested",
        "status",
        "tool name",
        "arguments",
        "requested by",
        "decided by",
        "reason",
        "conversation",
    ]
    filtered = staff_client.get(changelist, {"state": "denied"})
    assert filtered.context["cl"].result_count == 1
    searched = staff_client.get(changelist, {"q": "rm -rf"})
    assert [a.tool_name for a in searched.context["cl"].result_list] == ["terminal"]
    by_title = staff_client.get(changelist, {"q": "Budget"})
    assert by_title.context["cl"].result_count == 2
    by_user = staff_client.get(changelist, {"q": "bob"})
    assert by_user.context["cl"].result_count == 1


def test_add_and_change_are_refused(staff_client, rows):
    allowed = rows[0]
    assert staff_client.get(reverse("admin:approvals_toolapproval_add")).status_code == 403
    change_url = reverse("admin:approvals_toolapproval_change", args=[allowed.pk])
    # The change page is a read-only view; posting to it changes nothing.
    assert staff_client.get(change_url).status_code == 200
    response = staff_client.post(change_url, {"status": "denied", "note": "tampered"})
    assert response.status_code == 403
    allowed.refresh_from_db()
    assert (allowed.status, allowed.note) == ("allowed", "-fine")


@pytest.mark.parametrize("reason", ["timeout", "cancelled", "expired"])
def test_a_call_nobody_decided_shows_as_such_never_as_denied(staff_client, rows, reason):
    ended = make_approval(rows[0].conversation, status="denied", reason=reason)
    changelist = reverse("admin:approvals_toolapproval_changelist")
    page = staff_client.get(changelist).content.decode()
    label = ToolApproval.Reason(reason).label
    assert f'<span class="audit-status audit-{reason}">{label}</span>' in page
    assert f"state={reason}" in page  # the filter offers it
    only = staff_client.get(changelist, {"state": reason}).context["cl"].result_list
    assert [a.pk for a in only] == [ended.pk]
    # "Denied" means a person's or a rule's no: the ended call is not among them.
    denied = staff_client.get(changelist, {"state": "denied"}).context["cl"].result_list
    assert ended.pk not in [a.pk for a in denied] and rows[1].pk in [a.pk for a in denied]


def test_nobody_deletes_an_audit_row_in_the_admin_not_even_a_superuser(staff_client, rows):
    """purge_approvals is the one way rows leave: no Delete action, no delete page."""
    changelist = staff_client.get(reverse("admin:approvals_toolapproval_changelist"))
    assert changelist.status_code == 200
    assert b'value="delete_selected"' not in changelist.content
    delete_url = reverse("admin:approvals_toolapproval_delete", args=[rows[0].pk])
    assert staff_client.get(delete_url).status_code == 403
    assert staff_client.post(delete_url, {"post": "yes"}).status_code == 403
    bulk = staff_client.post(
        reverse("admin:approvals_toolapproval_changelist"),
        {"action": "delete_selected", "_selected_action": [r.pk for r in rows], "post": "yes"},
    )
    assert bulk.status_code in (200, 302)
    assert ToolApproval.objects.count() == len(rows)


def test_staff_who_is_not_superuser_cannot_delete(rows):
    from django.contrib.auth.models import Permission

    staff = make_user("auditor", staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_toolapproval", "delete_toolapproval"])
    )
    client = Client()
    client.force_login(staff)
    delete_url = reverse("admin:approvals_toolapproval_delete", args=[rows[0].pk])
    assert client.get(delete_url).status_code == 403
    assert ToolApproval.objects.filter(pk=rows[0].pk).exists()


def test_csv_export(staff_client, rows):
    allowed, denied, pending = rows
    response = staff_client.post(
        reverse("admin:approvals_toolapproval_changelist"),
        {"action": "export_csv", "_selected_action": [allowed.pk, denied.pk]},
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(response.content.decode())))
    # An id may start with "-" (URL-safe base64): then its cell is neutralised too.
    expected = {
        ("'" if a.startswith("-") else "") + a for a in (allowed.approval_id, denied.approval_id)
    }
    assert {r["approval_id"] for r in table} == expected
    by_tool = {r["tool_name"]: r for r in table}
    assert by_tool["terminal"]["arguments"] == '{"command": "rm -rf /tmp/x"}'
    assert by_tool["terminal"]["decided_by"] == "bob"
    assert by_tool["terminal"]["conversation_title"] == "Server logs"
    # Formula-looking cells are neutralised for spreadsheets.
    assert by_tool["python"]["note"] == "'-fine"
    assert by_tool["python"]["status"] == "allowed"


def test_csv_export_escapes_every_cell_usernames_and_ids_included(staff_client):
    mallory = make_user("=HYPERLINK(1)")
    conversation = make_conversation(mallory, title="@SUM(1)")
    row = make_approval(
        conversation,
        tool_name="+cmd",
        run_id="-2+3",
        status="denied",
        reason="user",
        decided_by=mallory,
        decided_at=timezone.now(),
        note="\tx",
    )
    response = staff_client.post(
        reverse("admin:approvals_toolapproval_changelist"),
        {"action": "export_csv", "_selected_action": [row.pk]},
    )
    (line,) = list(csv.DictReader(io.StringIO(response.content.decode())))
    for field in ("requested_by", "decided_by", "conversation_title", "tool_name", "run_id"):
        assert line[field].startswith("'"), (field, line[field])
    for value in line.values():
        assert not value or value[0] not in "=+-@\t\r", line


def test_members_cannot_open_the_admin(alice):
    client = Client()
    client.force_login(alice)
    response = client.get(reverse("admin:approvals_toolapproval_changelist"))
    assert response.status_code == 302


def test_an_edited_call_and_a_rules_call_say_why_in_the_admin_and_the_csv(staff_client, alice):
    conversation = make_conversation(alice)
    rule = ToolRule.objects.create(tool="terminal", pattern="ls *", action="allow", note="reads")
    by_rule = make_approval(
        conversation,
        tool_name="terminal",
        arguments={"command": "ls -la"},
        status="allowed",
        reason="rule",
        rule=rule,
        rule_snapshot=rule.snapshot(),
    )
    edited = make_approval(
        conversation,
        arguments={"code": "print(1)"},
        status="allowed",
        reason="edited",
        decided_by=alice,
        decided_at=timezone.now(),
        approved_arguments={"code": "print(2)"},
        approved_sha256=arguments_hash({"code": "print(2)"}),
    )
    rule.delete()  # the history keeps its copy
    page = staff_client.get(reverse("admin:approvals_toolapproval_change", args=[edited.pk]))
    html = page.content.decode()
    assert "Allowed with edits" in html
    assert "-print(1)" in html and "+print(2)" in html
    page = staff_client.get(reverse("admin:approvals_toolapproval_change", args=[by_rule.pk]))
    assert "rule: allow terminal &quot;ls *&quot; (everyone) — reads" in page.content.decode()

    response = staff_client.post(
        reverse("admin:approvals_toolapproval_changelist"),
        {"action": "export_csv", "_selected_action": [by_rule.pk, edited.pk]},
    )
    table = {r["reason"]: r for r in csv.DictReader(io.StringIO(response.content.decode()))}
    assert table["rule"]["rule"] == 'allow terminal "ls *" (everyone) — reads'
    assert table["edited"]["approved_arguments"] == '{"code": "print(2)"}'
    assert table["edited"]["approved_sha256"] == arguments_hash({"code": "print(2)"})
    filtered = staff_client.get(
        reverse("admin:approvals_toolapproval_changelist"), {"reason__exact": "edited"}
    )
    assert filtered.context["cl"].result_count == 1


def test_the_tool_rules_admin_shows_the_environments_allow_rules(staff_client, settings):
    settings.STUDIO_AUTO_ALLOW_TOOLS = ["web_fetch"]
    page = staff_client.get(reverse("admin:approvals_toolrule_changelist"))
    assert "STUDIO_AUTO_ALLOW_TOOLS (read-only): web_fetch" in page.content.decode()
    for label in ("Tool", "Pattern", "Action"):
        assert label in staff_client.get(reverse("admin:approvals_toolrule_add")).content.decode()


def test_a_rule_names_a_tool_there_is_and_picks_its_member_by_search(staff_client, alice):
    """Issue 37: "termnal" was saved, and Member and Conversation were raw id boxes."""
    from chat.models import McpServer

    McpServer.objects.create(name="files", command="x", tools=[{"name": "write"}], enabled=True)
    add = reverse("admin:approvals_toolrule_add")
    form = {"pattern": "", "action": "deny", "note": "", "scope": "everyone"}
    typo = staff_client.post(add, {**form, "tool": "termnal"})
    assert typo.status_code == 200 and "Select a valid choice" in typo.content.decode()
    assert not ToolRule.objects.exists()
    for tool in ("terminal", "*", "files__write", "web_search"):
        assert staff_client.post(add, {**form, "tool": tool}).status_code == 302, tool
    assert sorted(ToolRule.objects.values_list("tool", flat=True)) == [
        "*",
        "files__write",
        "terminal",
        "web_search",
    ]
    page = staff_client.get(add).content.decode()
    assert 'name="member"' in page and "admin-autocomplete" in page
    found = staff_client.get(
        reverse("admin:autocomplete"),
        {"term": "ali", "app_label": "approvals", "model_name": "toolrule", "field_name": "member"},
    ).json()
    assert [r["text"] for r in found["results"]] == ["alice"]


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.054619425999817395, "55 ms"), (3.24, "3.2 s"), (125, "2 min 5 s"), (11400, "3 h 10 min"),
     (None, "—")],
)  # fmt: skip
def test_durations_read_in_units(seconds, said):
    from approvals.admin import duration

    assert duration(seconds) == said


def test_the_detail_page_shows_durations_in_units(staff_client, rows):
    allowed = rows[0]
    ToolApproval.objects.filter(pk=allowed.pk).update(
        decision_seconds=0.054619425999817395, run_seconds=3.24
    )
    page = staff_client.get(reverse("admin:approvals_toolapproval_change", args=[allowed.pk]))
    html = page.content.decode()
    assert "55 ms" in html and "3.2 s" in html and "0.0546" not in html


def test_the_rules_admin_says_whom_a_rule_is_for_in_words(admin_client, alice):
    """Issue 55: a conversation's rule showed Member "-", the filter read "By
    revoked at: Empty / Not empty", and the add form offered read-only Hits."""
    from approvals.models import ToolRule
    from tests.factories import make_conversation

    chat = make_conversation(alice, title="Quarterly numbers")
    ToolRule.objects.create(tool="terminal", pattern="ls *", action="allow",
                            scope="conversation", conversation=chat)  # fmt: skip
    ToolRule.objects.create(tool="python", action="ask", scope="member", member=alice)
    page = admin_client.get("/admin/approvals/toolrule/").content.decode()
    assert "“Quarterly numbers” (alice)" in page and ">alice<" in page
    assert "By state" in page and "Revoked" in page and "By revoked at" not in page
    add = admin_client.get("/admin/approvals/toolrule/add/").content.decode()
    assert 'name="tool"' in add and "Hits" not in add and "Revoked by" not in add
    # And conversations are started in the chat, never added in the admin.
    assert admin_client.get("/admin/chat/conversation/add/").status_code == 403

"""Issue 38: files in and out, in Chromium: upload, a python call reads it and
writes another, and both download through Studio."""

from __future__ import annotations

import json
import os
import re

import pytest

from approvals.models import ToolApproval, arguments_hash
from chat.models import Conversation, Message
from tests.browser.ui import card_for, login, new_chat, run_finished

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


def allow(page, text: str) -> None:
    card_for(page, text).locator("button[value=allow]").click()


@pytest.mark.parametrize("width", [390, 1280])
def test_upload_read_it_in_python_and_download_what_it_made(
    sized, studio_server, member, tmp_path, width
):
    page = sized
    data = tmp_path / "sales.csv"
    data.write_text("region,total\nnorth,12\nsouth,30\n")
    login(page, studio_server)
    new_chat(page)
    page.set_input_files("#upload-files", str(data))
    # The settings panel redrawn meanwhile (here by a change; a socket's
    # reconnect does it too) keeps the file chosen.
    with page.expect_response(lambda r: "/settings/" in r.url):
        page.locator("#settings input[value=web_fetch]").uncheck()
    page.locator(".upload-form button", has_text="Upload").click()
    page.locator(".uploaded", has_text="Uploaded sales.csv.").wait_for()
    page.locator(".files a", has_text="sales.csv").wait_for()

    code = (
        "rows = open('sales.csv').read().splitlines()[1:]; "
        "open('total.txt', 'w').write(str(sum(int(r.split(',')[1]) for r in rows))); "
        "print(len(rows), 'rows')"
    )
    allow(page, f"run python: {code}")
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*2 rows\s*$")).wait_for()
    run_finished(page)
    # What the call made shows in the list once its step ends, and downloads.
    made = page.locator(".files a", has_text="total.txt")
    made.wait_for()
    with page.expect_download() as download:
        made.click()
    assert download.value.suggested_filename == "total.txt"
    assert open(download.value.path()).read() == "42"
    with page.expect_download() as download:
        page.locator(".files a", has_text="sales.csv").click()
    assert open(download.value.path()).read() == data.read_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("width", [390, 1280])
def test_an_export_round_trips_what_the_chat_holds(sized, studio_server, member, width):
    page = sized
    login(page, studio_server)
    new_chat(page)
    allow(page, "run python: print(6 * 7)")
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*42\s*$")).wait_for()
    run_finished(page)
    with page.expect_download() as download:
        page.locator(".export-links a", has_text="JSON").click()
    document = json.loads(open(download.value.path()).read())
    with page.expect_download() as download:
        page.locator(".export-links a", has_text="Markdown").click()
    markdown = open(download.value.path()).read()

    conversation = Conversation.objects.get(pk=document["conversation"]["id"])
    stored = list(conversation.messages.order_by("created_at", "id"))
    assert [(m["id"], m["role"], m["content"]) for m in document["messages"]] == [
        (m.pk, m.role, m.content) for m in stored
    ]
    [row] = document["approvals"]
    approval = ToolApproval.objects.get(approval_id=row["approval_id"])
    assert (row["status"], row["arguments"]) == ("allowed", {"code": "print(6 * 7)"})
    assert row["arguments_sha256"] == approval.arguments_sha256 == arguments_hash(row["arguments"])
    assert "run python: print(6 * 7)" in markdown and "**python** call (Allowed)" in markdown
    assert Message.objects.filter(conversation=conversation, role="tool").get().content in markdown

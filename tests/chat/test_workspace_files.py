"""Files in and out of a conversation's workspace: uploads, the listing, downloads,
and the model's workspace: links; never through a symlink a tool left there."""

from __future__ import annotations

import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from chat.templatetags.chat_tags import markdown
from chat.tools.sandbox import sandbox_ids
from chat.transcript import transcript_build
from tests.factories import make_conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(alice, tmp_path, settings):
    settings.STUDIO_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.STUDIO_WORKSPACE_ROOT.mkdir()
    return make_conversation(alice)


def upload(client, chat, *files, htmx=True):
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    return client.post(reverse("chat:upload", args=[chat.pk]), {"files": list(files)}, **headers)


def a_file(name: str, data: bytes = b"a,b\n1,2\n") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="text/csv")


def test_an_upload_lands_in_the_workspace_owned_by_the_tools_uid(alice_client, chat):
    response = upload(alice_client, chat, a_file("data.csv"), a_file("notes.txt", b"hi"))
    assert response.status_code == 200
    assert "Uploaded data.csv, notes.txt." in response.text
    assert reverse("chat:download", args=[chat.pk, "data.csv"]) in response.text
    saved = chat.workspace / "data.csv"
    assert saved.read_bytes() == b"a,b\n1,2\n"
    ids = sandbox_ids(chat.workspace)
    if ids is not None:  # as root (CI): the tools' own uid, so a tool can change it
        assert (saved.stat().st_uid, saved.stat().st_gid) == ids
    assert not [p for p in chat.workspace.iterdir() if p.name.startswith(".studio-")]
    # The agent is told the names (and sizes) at its next turn.
    system = transcript_build(chat, tools="python")[0]["content"]
    assert "data.csv (8 B)" in system and "notes.txt (2 B)" in system


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ([a_file(".env")], "not a file name Studio keeps"),
        ([a_file("   ")], "not a file name Studio keeps"),
        ([a_file("x" * 201)], "limited to 200 characters"),
        ([a_file("a.csv"), a_file("a.csv")], "the same name"),
        ([a_file("big.bin", b"x" * 2048)], "limited to 0.001 MB each"),
        ([], "Choose a file"),
    ],
)
def test_a_refused_upload_says_why_and_writes_nothing(alice_client, chat, settings, files, reason):
    settings.STUDIO_UPLOAD_MAX_MB = 0.001
    response = upload(alice_client, chat, *files)
    assert response.status_code == 400 and reason in response.text
    assert not chat.workspace.exists() or not list(chat.workspace.iterdir())


def test_an_upload_over_the_workspace_quota_is_refused_whole(alice_client, chat, settings):
    settings.STUDIO_WORKSPACE_QUOTA_MB = 1
    small, big = a_file("small.txt", b"s"), a_file("big.bin", b"x" * (1024 * 1024))
    response = upload(alice_client, chat, small, big)
    assert response.status_code == 400 and "would not fit" in response.text
    assert not (chat.workspace / "small.txt").exists()  # all or nothing


def test_a_name_that_is_a_folder_refuses_the_whole_upload(alice_client, chat):
    """Issue 55: the request answered 500 and the files written before it stayed."""
    (chat.workspace / "reports").mkdir(parents=True)
    response = upload(alice_client, chat, a_file("first.csv"), a_file("reports"))
    assert response.status_code == 400 and "reports is a folder" in response.text
    assert sorted(p.name for p in chat.workspace.iterdir()) == ["reports"]


def test_names_that_differ_only_in_unicode_form_are_one_name(alice_client, chat):
    import unicodedata

    composed, decomposed = (unicodedata.normalize(f, "café.txt") for f in ("NFC", "NFD"))
    assert upload(alice_client, chat, a_file(decomposed, b"first")).status_code == 200
    assert upload(alice_client, chat, a_file(composed, b"second")).status_code == 200
    assert [p.name for p in chat.workspace.iterdir()] == [composed]
    assert (chat.workspace / composed).read_bytes() == b"second"
    both = upload(alice_client, chat, a_file(composed), a_file(decomposed))
    assert both.status_code == 400 and "the same name" in both.text


def test_room_reserved_by_an_upload_in_flight_counts(alice_client, chat, settings):
    """Across processes the quota is held in the database: an upload still
    being written elsewhere holds its room until it is on disk."""
    from chat.models import Conversation

    settings.STUDIO_WORKSPACE_QUOTA_MB = 1
    Conversation.objects.filter(pk=chat.pk).update(upload_reserved_bytes=900 * 1024)
    response = upload(alice_client, chat, a_file("more.bin", b"x" * 200 * 1024))
    assert response.status_code == 400 and "uploads in progress" in response.text
    Conversation.objects.filter(pk=chat.pk).update(upload_reserved_bytes=0)
    assert upload(alice_client, chat, a_file("more.bin", b"x" * 200 * 1024)).status_code == 200
    assert Conversation.objects.get(pk=chat.pk).upload_reserved_bytes == 0  # given back


def test_an_upload_replaces_a_symlink_never_writes_through_it(alice_client, chat, tmp_path):
    target = tmp_path / "server-file"
    target.write_text("keep me")
    chat.workspace.mkdir()
    (chat.workspace / "data.csv").symlink_to(target)
    assert upload(alice_client, chat, a_file("data.csv", b"new")).status_code == 200
    assert target.read_text() == "keep me"
    assert not (chat.workspace / "data.csv").is_symlink()
    assert (chat.workspace / "data.csv").read_bytes() == b"new"


def test_a_plain_form_upload_works_without_script(alice_client, chat):
    response = upload(alice_client, chat, a_file("data.csv"), htmx=False)
    assert response.status_code == 302 and (chat.workspace / "data.csv").exists()


def test_downloads_serve_regular_files_only_and_only_to_the_owner(
    alice_client, chat, bob, tmp_path
):
    secret = tmp_path / "secret"
    secret.write_text("server secret")
    chat.workspace.mkdir()
    (chat.workspace / "out").mkdir()
    (chat.workspace / "out" / "report.csv").write_text("x,y\n")
    (chat.workspace / "link.txt").symlink_to(secret)
    (chat.workspace / "linked-folder").symlink_to(tmp_path)
    os.mkfifo(chat.workspace / "pipe")

    def get(name, client=alice_client):
        return client.get(reverse("chat:download", args=[chat.pk, name]))

    response = get("out/report.csv")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"x,y\n"
    assert response["Content-Disposition"] == 'attachment; filename="report.csv"'
    assert response["Content-Type"] == "application/octet-stream"
    assert response["X-Content-Type-Options"] == "nosniff"
    for odd in (
        "link.txt",
        "linked-folder/secret",
        "pipe",
        "out",
        "nothing.txt",
        "out/../link.txt",
    ):
        assert get(odd).status_code == 404, odd
    other = Client()
    other.force_login(bob)
    assert get("out/report.csv", client=other).status_code == 404


def test_the_listing_shows_files_never_links(alice_client, chat, tmp_path):
    chat.workspace.mkdir()
    (chat.workspace / "made.txt").write_text("1")
    (chat.workspace / "sub").mkdir()
    (chat.workspace / "sub" / "deep.txt").write_text("22")
    (chat.workspace / "link").symlink_to(tmp_path)
    page = alice_client.get(chat.get_absolute_url()).text
    assert ">made.txt</a>" in page and ">sub/deep.txt</a>" in page
    assert ">link</a>" not in page


def test_the_models_workspace_links_become_downloads_of_this_chat():
    html = markdown("Here: [the report](workspace:out/my%20report.csv).", 7)
    assert 'href="/c/7/workspace/out/my%20report.csv"' in html
    assert 'href=""' in markdown("[x](workspace:../../etc/passwd)", 7)
    assert 'href=""' in markdown("[x](workspace:/etc/passwd)", 7)
    # Without a conversation (or any other scheme) nothing is rewritten.
    assert "workspace:" not in markdown("[x](workspace:a.txt)")
    assert 'href="https://example.com"' in markdown("[x](https://example.com)", 7)


def test_a_cut_output_offers_its_whole_as_a_download(alice_client, chat):
    from chat.models import Message

    Message.objects.create(
        conversation=chat, role="assistant", content="Running it.",
        tool_calls=[{"id": "c1", "name": "python", "arguments": {"code": "..."}}],
    )  # fmt: skip
    whole = {"name": "tool-output/x.txt", "size": 220000, "mime": "text/plain", "shown": False,
             "output": True}  # fmt: skip
    Message.objects.create(
        conversation=chat, role="tool", tool_call_id="c1", tool_name="python",
        content="line 0\n[output truncated: 155000 more bytes not shown]", attachments=[whole],
    )  # fmt: skip
    page = alice_client.get(chat.get_absolute_url()).text
    link = reverse("chat:download", args=[chat.pk, "tool-output/x.txt"])
    assert f'<a href="{link}" download>Download all of it</a> (214.8' in page


def test_files_sent_with_a_message_are_named_only_when_they_are_there(alice_client, chat):
    from chat.workspace import attached_note

    answer = alice_client.post(
        reverse("chat:upload", args=[chat.pk]),
        {"files": [a_file("data.csv"), a_file("café.txt")]},
        headers={"accept": "application/json"},
    )
    assert answer.status_code == 200 and answer.json() == {"saved": ["data.csv", "café.txt"]}
    assert attached_note(chat, ["data.csv", "café.txt"]) == (
        "Files added to the working folder with this message: data.csv, café.txt."
    )
    for names in (
        [],
        "data.csv",
        ["missing.csv"],
        ["../data.csv"],
        ["sub/data.csv"],
        [".hidden"],
        [7],
        ["data.csv"] * 21,
        {"a": 1},
    ):
        assert attached_note(chat, names) is None, names


def test_an_upload_asked_for_as_json_answers_its_refusal_in_json(alice_client, chat):
    answer = alice_client.post(
        reverse("chat:upload", args=[chat.pk]),
        {"files": [a_file(".env")]},
        headers={"accept": "application/json"},
    )
    assert answer.status_code == 400
    assert "not a file name Studio keeps" in answer.json()["error"]
    assert not (chat.workspace / ".env").exists()


def test_the_plain_form_sends_files_with_the_message(alice_client, chat):
    from chat.models import Message

    answer = alice_client.post(
        reverse("chat:send", args=[chat.pk]),
        {"message": "Look.", "files": [a_file("data.csv")]},
    )
    assert answer.status_code == 302
    assert (chat.workspace / "data.csv").exists()
    sent = Message.objects.get(conversation=chat, role="user").content
    assert sent == "Look.\n\nFiles added to the working folder with this message: data.csv."

"""Images tools make: shown under their output, served only to their owner, never as script."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from chat.tools import builtin_tools
from studio.cancel import CancelToken
from tests.factories import make_conversation

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("root_sandbox")]

PNG = (
    "import base64\n"
    "open('dot.png', 'wb').write(base64.b64decode("
    "'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=='))\n"
    "print('made')"
)


def workspace_of(settings, conversation):
    return conversation.workspace


def python(code: str, workspace):
    return builtin_tools()["python"].execute(
        {"code": code}, cancel=CancelToken(), timeout=30, workspace=workspace
    )


def test_an_image_a_call_writes_is_reported_and_the_model_told_its_name(settings, conversation):
    result = python(PNG, workspace_of(settings, conversation))
    assert result.ok
    assert result.images == ({"name": "dot.png", "size": 70, "mime": "image/png", "shown": True},)
    assert result.text == "made\n\n[Files created: dot.png (70 B). They are shown to the user.]"
    # Unchanged on the next call: not reported again.
    again = python("print('nothing new')", workspace_of(settings, conversation))
    assert again.images == () and again.text == "nothing new\n"


def test_matplotlib_show_saves_the_figures(settings, conversation):
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.show()\n"
        "plt.figure(); plt.bar([1, 2], [3, 4])\n"  # never shown: saved at the end
        "print('plotted')"
    )
    result = python(code, workspace_of(settings, conversation))
    assert result.ok, result.text
    names = [image["name"] for image in result.images]
    assert names == ["figure-1.png", "figure-2.png"]
    assert all(image["mime"] == "image/png" and image["size"] > 1000 for image in result.images)


def test_a_large_image_is_listed_not_shown(settings, conversation):
    settings.STUDIO_IMAGE_MAX_MB = 0.001  # ~1 KB
    result = python(
        "open('big.png', 'wb').write(b'\\x89PNG' + bytes(5000))",
        workspace_of(settings, conversation),
    )
    assert result.images[0]["shown"] is False


@pytest.fixture
def images(settings, conversation, bob):
    root = workspace_of(settings, conversation)
    python(PNG, root)
    theirs = make_conversation(bob)
    python(PNG, workspace_of(settings, theirs))
    conversation.other_id = theirs.pk
    python(
        "open('x.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>')\n"
        "open('notes.txt', 'w').write('secret')\n"
        "import os; os.symlink('/etc/passwd', 'passwd.png')",
        root,
    )
    return root


def get(user, conversation, name):
    client = Client()
    client.force_login(user)
    return client.get(f"/c/{conversation.pk}/files/{name}")


def test_the_owner_gets_the_image_with_safe_headers(images, alice, conversation):
    response = get(alice, conversation, "dot.png")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert b"".join(response.streaming_content).startswith(b"\x89PNG")
    svg = get(alice, conversation, "x.svg")
    assert svg["Content-Type"] == "image/svg+xml"
    assert "sandbox" in svg["Content-Security-Policy"]
    assert "default-src 'none'" in svg["Content-Security-Policy"]


@pytest.mark.parametrize(
    "name", ["notes.txt", "passwd.png", "../conversation-{other}/dot.png", "missing.png"]
)
def test_nothing_else_is_served(images, alice, conversation, name):
    name = name.format(other=conversation.other_id)
    assert get(alice, conversation, name).status_code == 404


def test_nobody_else_sees_them(images, bob, conversation):
    assert get(bob, conversation, "dot.png").status_code == 404


def test_the_chat_shows_them_under_the_output(images, alice, conversation, settings):
    from chat.models import Message

    mine = make_conversation(alice)
    Message.objects.create(
        conversation=mine,
        role="assistant",
        tool_calls=[{"id": "c1", "name": "python", "arguments": {"code": "x"}}],
    )
    Message.objects.create(
        conversation=mine,
        role="tool",
        tool_call_id="c1",
        content="made",
        attachments=[{"name": "dot.png", "size": 70, "mime": "image/png", "shown": True}],
    )
    client = Client()
    client.force_login(alice)
    page = client.get(mine.get_absolute_url()).content.decode()
    assert re.search(rf'<img src="/c/{mine.pk}/files/dot.png" alt="dot.png"', page)

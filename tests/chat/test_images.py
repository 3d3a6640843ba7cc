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
    (image,) = result.images
    assert re.fullmatch(r"[\w-]{12}/dot\.png", image.pop("key"))
    assert image == {"name": "dot.png", "size": 70, "mime": "image/png", "shown": True}
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


@pytest.mark.parametrize("sessions", [True, False])
def test_a_plot_prints_only_what_its_code_prints(settings, conversation, sessions):
    """Issue 55: every plot began with ~9 lines of matplotlib's and fontconfig's
    complaints about where to write, with the host's workspace path."""
    from chat.tools.sessions import SEEN_MARK, SESSIONS

    settings.STUDIO_PYTHON_SESSIONS = sessions
    code = (
        "import matplotlib.pyplot as plt, matplotlib.font_manager as fm\n"
        "plt.plot([1, 2, 3]); plt.title('x')\n"
        "plt.savefig('plot.png'); plt.close('all')\n"
        "print('plotted', len(fm.fontManager.ttflist) > 0)"
    )
    workspace = workspace_of(settings, conversation)
    try:
        for _ in range(2):  # the font list is built once, not per call
            result = python(code, workspace)
            assert result.ok, result.text
            assert result.text.split("\n\n")[0] == "plotted True", result.text
    finally:
        # Rolled-back tests reuse primary keys: leave no session, nor its mark.
        SESSIONS.end(workspace)
        (workspace / SEEN_MARK).unlink(missing_ok=True)
    assert not (workspace / ".config").exists() and not (workspace / ".cache").exists()
    cache = settings.STUDIO_WORKSPACE_ROOT.parent / "tool-cache" / "matplotlib"
    assert list(cache.glob("fontlist-v*.json"))


def test_a_large_image_is_listed_not_shown(settings, conversation):
    settings.STUDIO_IMAGE_MAX_MB = 0.001  # ~1 KB
    result = python(
        "open('big.png', 'wb').write(b'\\x89PNG' + bytes(5000))",
        workspace_of(settings, conversation),
    )
    assert result.images[0]["shown"] is False


@pytest.fixture
def images(settings, conversation, bob):
    """Alice's dot.png and x.svg, each by the key of Studio's copy; Bob's dot.png."""
    root = workspace_of(settings, conversation)
    made = python(PNG, root).images
    theirs = make_conversation(bob)
    conversation.other = theirs
    conversation.others_key = python(PNG, workspace_of(settings, theirs)).images[0]["key"]
    made += python(
        "open('x.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>')\n"
        "open('notes.txt', 'w').write('secret')\n"
        "import os; os.symlink('/etc/passwd', 'passwd.png')",
        root,
    ).images
    return {image["name"]: image["key"] for image in made}


def get(user, conversation, name):
    client = Client()
    client.force_login(user)
    return client.get(f"/c/{conversation.pk}/files/{name}")


def test_the_owner_gets_the_image_with_safe_headers(images, alice, conversation):
    assert set(images) == {"dot.png", "x.svg"}  # the link and the text file were not kept
    response = get(alice, conversation, images["dot.png"])
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert b"".join(response.streaming_content).startswith(b"\x89PNG")
    svg = get(alice, conversation, images["x.svg"])
    assert svg["Content-Type"] == "image/svg+xml"
    assert "sandbox" in svg["Content-Security-Policy"]
    assert "default-src 'none'" in svg["Content-Security-Policy"]


@pytest.mark.parametrize(
    "name",
    [
        "dot.png",  # the workspace's file: pages never read a workspace
        "notes.txt",
        "passwd.png",
        "{key}/../../conversation-{other}/{others_key}",
        "../conversation-{other}/{others_key}",
        "{others_key}",  # Bob's copy, under Alice's conversation
        "missing/missing.png",
        "a/b/c.png",
        "%00/x.png",
        "{key}%00.png",
        "..%2f..%2fx/y.png",
    ],
)
def test_nothing_else_is_served(images, alice, conversation, name):
    name = name.format(
        key=images["dot.png"].split("/")[0],
        other=conversation.other.pk,
        others_key=conversation.others_key,
    )
    assert get(alice, conversation, name).status_code == 404


def test_nobody_else_sees_them(images, bob, conversation):
    assert get(bob, conversation, images["dot.png"]).status_code == 404


def test_the_copy_outlives_what_the_workspace_does_to_the_file(images, alice, conversation):
    """Deleted, or swapped for a link to another member's image: the page serves the copy."""
    original = b"".join(get(alice, conversation, images["dot.png"]).streaming_content)
    path = conversation.workspace / "dot.png"
    path.unlink()
    path.symlink_to(conversation.other.workspace / "dot.png")
    again = b"".join(get(alice, conversation, images["dot.png"]).streaming_content)
    assert again == original


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
        attachments=[
            {"name": "dot.png", "size": 70, "mime": "image/png", "shown": True, "key": "k/dot.png"}
        ],
    )
    client = Client()
    client.force_login(alice)
    page = client.get(mine.get_absolute_url()).content.decode()
    assert re.search(rf'<img src="/c/{mine.pk}/files/k/dot.png" alt="dot.png"', page)


def test_the_copy_never_follows_a_folder_swapped_for_a_link(tmp_path):
    """A tool that keeps swapping a folder of its workspace with a link to another
    workspace: each read gets its own file or nothing, never the other's."""
    import os
    import threading

    from chat.tools.images import read_beneath

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    (mine / "real").mkdir(parents=True)
    (mine / "real" / "secret.png").write_bytes(b"mine")
    theirs.mkdir()
    (theirs / "secret.png").write_bytes(b"THEIRS")
    (mine / "link").symlink_to(theirs)
    stop = threading.Event()
    swaps = [0]

    def swap() -> None:
        # rename(2) over the name: "d" is the real folder, then the link, and so on.
        while not stop.is_set():
            os.rename(mine / "real", mine / "d")
            os.rename(mine / "d", mine / "real")
            os.rename(mine / "link", mine / "d")
            os.rename(mine / "d", mine / "link")
            swaps[0] += 1

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        seen = {read_beneath(mine, "d/secret.png", limit=100) for _ in range(3000)}
    finally:
        stop.set()
        swapper.join(10)
    assert not swapper.is_alive() and swaps[0] > 10
    assert seen <= {b"mine", None}
    # Either state on its own: the real folder reads, the link does not.
    os.rename(mine / "real", mine / "d")
    assert read_beneath(mine, "d/secret.png", limit=100) == b"mine"
    os.rename(mine / "d", mine / "real")
    os.rename(mine / "link", mine / "d")
    assert read_beneath(mine, "d/secret.png", limit=100) is None


@pytest.mark.parametrize("odd", ["link", "fifo", "big", "dotdot", "absolute", "folder"])
def test_an_odd_file_is_not_copied(tmp_path, odd):
    import os

    from chat.tools.images import read_beneath

    (tmp_path / "ok.png").write_bytes(b"x" * 10)
    name = {"dotdot": "../ok.png", "absolute": str(tmp_path / "ok.png")}.get(odd, "odd.png")
    if odd == "link":
        (tmp_path / "odd.png").symlink_to(tmp_path / "ok.png")
    elif odd == "fifo":
        os.mkfifo(tmp_path / "odd.png")  # must not hang the run
    elif odd == "big":
        (tmp_path / "odd.png").write_bytes(b"x" * 101)
    elif odd == "folder":
        (tmp_path / "odd.png").mkdir()
    assert read_beneath(tmp_path, name, limit=100) is None
    assert read_beneath(tmp_path, "ok.png", limit=100) == b"x" * 10


def test_an_image_with_a_space_in_its_name_is_served_from_its_copy(settings, conversation, alice):
    result = python(PNG.replace("'dot.png'", "'my plot.png'"), workspace_of(settings, conversation))
    (image,) = result.images
    assert image["name"] == "my plot.png"
    response = get(alice, conversation, image["key"])
    assert response.status_code == 200
    assert b"".join(response.streaming_content).startswith(b"\x89PNG")

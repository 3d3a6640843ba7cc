"""Studio started from deploy/studio.env.example, as an operator copies it (issue 53)."""

from __future__ import annotations

import httpx
import pytest

from tests.helpers.live import LiveServer
from tests.helpers.procs import ROOT

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

EXAMPLE = ROOT / "deploy" / "studio.env.example"
# Host paths the example names: a test writes below its own folder instead.
PATHS = (
    "DJANGO_SECRET_KEY_FILE",
    "STUDIO_WORKSPACE_ROOT",
    "STUDIO_MEDIA_ROOT",
    "STUDIO_STATIC_ROOT",
)


def example_env() -> dict[str, str]:
    values = {}
    for line in EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def test_the_example_sets_every_production_setting_explicitly():
    values = example_env()
    assert values["DJANGO_DEBUG"] == "False"
    assert values["STUDIO_CHANNEL_PREFIX"]
    for name in ("DJANGO_SECRET_KEY_FILE", "DATABASE_URL", "REDIS_URL", "STUDIO_HTTPS"):
        assert values[name], name
    assert ":" in values["DATABASE_URL"].split("@")[0].split("//")[1]  # a password


def test_a_server_from_the_example_shows_no_debug_page(tmp_path):
    """A wrong Host, a 404 and a 500: plain pages, never settings or a traceback.

    The example's database role does not exist here, so any page that reads
    the database fails: the 500 the issue asks for, with the password in
    ``DATABASE_URL`` one debug page away.
    """
    values = example_env()
    env = {name: values[name] for name in values}
    for name in PATHS:
        env[name] = str(tmp_path / name.lower())
    (tmp_path / "studio_workspace_root").mkdir()
    env["STUDIO_DB_POOL_TIMEOUT"] = "1"  # the 500 without a minute's wait
    server = LiveServer(log_path=tmp_path / "server.log", **env)
    # LiveServer's environment is the test's, with the example's values on top.
    server.env.pop("STUDIO_CHANNEL_PREFIX", None)
    server.env.update(env)
    server.start()
    try:
        host = values["DJANGO_ALLOWED_HOSTS"].split(",")[0]
        https = {"X-Forwarded-Proto": "https"}
        with httpx.Client(base_url=server.url, timeout=20) as http:
            pages = {
                "bad host": http.get("/", headers={"Host": "evil.example", **https}),
                "404": http.get("/accounts/nope/", headers={"Host": host, **https}),
                # A session cookie makes the page read the database.
                "500": http.get("/", headers={"Host": host, "Cookie": "sessionid=x" * 4, **https}),
            }
    finally:
        server.stop()
    assert {name: page.status_code for name, page in pages.items()} == {
        "bad host": 400,
        "404": 404,
        "500": 500,
    }
    secret = values["DATABASE_URL"].split("//")[1].split("@")[0].split(":")[1]
    for name, page in pages.items():
        text = page.text
        for leak in (secret, "Traceback", "DATABASE_URL", "SECRET", "settings", "DEBUG"):
            assert leak not in text, (name, leak)
        assert len(text) < 2000, name  # a plain page, not a report


def test_a_servers_whole_output_is_json_lines_with_zoned_times(tmp_path, alice):
    """Issue 53: daphne's access lines stayed plain text in the JSON stream, and
    timestamps had no zone."""
    import json
    import re

    from tests.helpers.clients import Tab, session_cookie
    from tests.helpers.live import LiveServer

    server = LiveServer(
        log_path=tmp_path / "server.log", STUDIO_LOG_FORMAT="json", STUDIO_LOG_LEVEL="INFO"
    )
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=20) as http:
            http.get("/accounts/login/")
            http.get("/nope/?token=secret-in-a-query")
        tab = Tab(server.ws_url, None, session_cookie(alice), origin=server.url, path="/ws/me/")
        tab.close()
    finally:
        server.stop()
    lines = [line for line in server.log().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line, or this fails
    zoned = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)$")
    assert all(zoned.match(r["time"]) for r in records), records[:3]
    access = [r for r in records if r["logger"] == "studio.access"]
    assert {(r["method"], r["path"], r["status"]) for r in access} >= {
        ("GET", "/accounts/login/", 200),
        ("GET", "/nope/", 404),
    }
    assert "secret-in-a-query" not in server.log()

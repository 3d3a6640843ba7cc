from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.browser.ui import TIMEOUT
from tests.factories import make_live_member
from tests.helpers.live import LiveServer

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# The screens the README shows (docs/screenshots/): the browser tests take
# them; ``make screenshots`` runs those tests with STUDIO_UPDATE_SCREENSHOTS=1
# and they are copied there (not on every run: each would differ by its clock).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
README_SCREENS = (
    "02-pending-card.png",
    "04-allowed-output.png",
    "22-plot-inline.png",
    "42-inbox-1280.png",
    "42-inbox-390.png",
    "50-admin-list-1280.png",
    "51-dashboard-30-days.png",
    "55-live-output-390.png",
    "55-live-output-1280.png",
)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/browser/" in str(item.fspath):
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.time()
    yield ARTIFACTS
    if os.environ.get("STUDIO_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for name in README_SCREENS:
            taken = ARTIFACTS / name
            if taken.exists() and taken.stat().st_mtime >= started:
                shutil.copyfile(taken, SCREENSHOTS / name)


@pytest.fixture(scope="module")
def studio_server(django_db_setup, django_db_blocker, workspace_root, artifacts):
    server = LiveServer(
        log_path=artifacts / "daphne-browser.log",
        STUDIO_WORKSPACE_ROOT=str(workspace_root),
        STUDIO_APPROVAL_POLL_SECONDS="1",
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: run ./scripts/ensure-system-packages chromium:chromium "
            "(make test does)"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def member(settings):
    return make_live_member(settings, "carol")


@pytest.fixture
def admin_member(settings):
    return make_live_member(settings, "ada", superuser=True)


@pytest.fixture
def sized(browser, request):
    """A page as wide as the test's ``width`` parameter (390, 1024, 1280...), closed after."""
    width = request.node.callspec.params["width"]
    context = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
    context.set_default_timeout(TIMEOUT)
    yield context.new_page()
    context.close()


@pytest.fixture
def page(browser, studio_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT)
    page = context.new_page()
    yield page
    context.close()

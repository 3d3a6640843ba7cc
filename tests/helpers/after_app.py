"""Studio's ASGI application plus one page that leaves a call for after its answer.

For ``tests/test_handlers.py``: ``GET /test/after/`` answers at once and
leaves a call that holds the server's loop until the file named by
``STUDIO_TEST_AFTER_MARK`` exists (the client has the answer), at most
``HOLD_SECONDS``; it then writes what it saw to ``<mark>.seen``: "answered"
or "timeout". A call run before the answer is written holds the answer back,
so it can only time out.

    daphne tests.helpers.after_app:application
"""

from __future__ import annotations

from studio.asgi import application  # noqa: F401 - sets Django up first  # isort: skip

import os  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from django.contrib.auth.decorators import login_not_required  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.urls import clear_url_caches, path  # noqa: E402

import studio.urls  # noqa: E402
from studio.runtime import once_answered  # noqa: E402

HOLD_SECONDS = 5.0


def hold_until_answered() -> None:
    mark = Path(os.environ["STUDIO_TEST_AFTER_MARK"])
    deadline = time.monotonic() + HOLD_SECONDS
    while not mark.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(f"{mark}.seen").write_text("answered" if mark.exists() else "timeout")


@login_not_required
def after(request):
    once_answered(hold_until_answered)
    return HttpResponse("answer")


studio.urls.urlpatterns.insert(0, path("test/after/", after))
clear_url_caches()

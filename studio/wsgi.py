"""WSGI entry point: Studio's HTTP under a WSGI server (gunicorn), with daphne
serving only the WebSockets (Channels' second deployment layout, README).

A decision recorded here hands its run to the daphne processes (the shared
channel), which step runs; this process never does.
"""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from studio.process import settle
from studio.runtime import runtime

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")

application = get_wsgi_application()
# Cards, counts and the runs to resume leave from a loop of their own, which
# keeps its Redis connections; not a new loop per send in the request.
runtime().outbox.threaded()
settle()

"""Studio's HTTP under WSGI for benchmarks: the same scripted model and free tool
as ``bench/asgi.py`` (whose import sets them up), served by ``studio.wsgi``."""

from __future__ import annotations

import bench.asgi  # noqa: F401 - the echo tool and the scripted model
from studio.wsgi import application  # noqa: E402, F401

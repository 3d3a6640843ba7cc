"""Real daphne processes serving Studio on 127.0.0.1, on the test database."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deploy.cluster import DaphneProcess, free_port
from tests.helpers.procs import ROOT, child_env

__all__ = ["LiveServer", "free_port", "two_servers"]


class LiveServer(DaphneProcess):
    def __init__(
        self, *, log_path: Path, port: int | None = None, user: str | None = None, **env: str
    ) -> None:
        if user is None:
            super().__init__(env=child_env(**env), port=port, log_path=log_path)
            return
        # As an unprivileged user: the system's interpreter (the venv's base may
        # live in root's home) with the venv's packages, and the test's key.
        from django.conf import settings

        site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
        env = child_env(DJANGO_SECRET_KEY=settings.SECRET_KEY, **env)
        env["PYTHONPATH"] = f"{site}:{ROOT}"
        super().__init__(
            env=env, port=port, log_path=log_path, user=user, python="/usr/bin/python3"
        )

    def pause(self) -> None:
        """SIGSTOP: frozen as by a long GC pause, swapping or a paused VM."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def log(self) -> str:
        assert self.log_path is not None
        return self.log_path.read_text(errors="replace")


@contextmanager
def two_servers(
    log_dir: Path, *, user: str | None = None, **env: str
) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two processes of one cluster (give them the same ``REDIS_URL``), stopped after."""
    a = LiveServer(log_path=log_dir / "a.log", user=user, **env).start()
    try:
        b = LiveServer(log_path=log_dir / "b.log", user=user, **env).start()
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()

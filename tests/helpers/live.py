"""Real daphne processes serving Studio on 127.0.0.1, on the test database."""

from __future__ import annotations

from pathlib import Path

from deploy.cluster import DaphneProcess, free_port
from tests.helpers.procs import child_env

__all__ = ["LiveServer", "free_port"]


class LiveServer(DaphneProcess):
    def __init__(self, *, log_path: Path, **env: str) -> None:
        super().__init__(env=child_env(**env), log_path=log_path)

"""Services of a test's own, so restarting them disturbs nobody; a cluster's settings."""

from __future__ import annotations

import subprocess
import time

from tests.helpers.live import free_port


class PrivateRedis:
    """A redis-server only this test uses, so restarting it disturbs nobody."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        subprocess.run(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "yes",
            ],
            check=True,
            capture_output=True,
        )
        self._wait(up=True)

    def stop(self) -> None:
        subprocess.run(
            ["redis-cli", "-p", str(self.port), "shutdown", "nosave"], capture_output=True
        )
        self._wait(up=False)

    def _wait(self, *, up: bool) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ok = (
                subprocess.run(
                    ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
                ).stdout.strip()
                == "PONG"
            )
            if ok == up:
                return
            time.sleep(0.05)
        raise AssertionError(f"redis on {self.port} did not go {'up' if up else 'down'}")


def cluster_env(redis_url: str, workspace_root) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "STUDIO_WORKSPACE_ROOT": str(workspace_root),
        "STUDIO_APPROVAL_POLL_SECONDS": "0.2",
        "STUDIO_RUN_HEARTBEAT_SECONDS": "0.5",
        "STUDIO_RUN_STALE_SECONDS": "2",
        "STUDIO_LAYER_WATCH_SECONDS": "0.5",
        "STUDIO_SHUTDOWN_GRACE_SECONDS": "8",
    }

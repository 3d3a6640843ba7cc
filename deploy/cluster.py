"""Start N local daphne processes of Studio (for benchmarks, tests and trying it out).

    python -m deploy.cluster --processes 2 --base-port 8001 \
        --database-url postgres://postgres@127.0.0.1:5432/studio \
        --redis-url redis://127.0.0.1:6379/0

Each process is a plain ``daphne studio.asgi:application`` on 127.0.0.1; put a
proxy in front for one address (see deploy/nginx-site.conf). Ctrl-C stops
them all.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaphneProcess:
    """One daphne serving Studio on 127.0.0.1:<port> with the given environment."""

    def __init__(
        self,
        *,
        env: dict[str, str],
        port: int | None = None,
        log_path: Path | None = None,
        app: str = "studio.asgi:application",
        server: str = "daphne",
        user: str | None = None,
        python: str = sys.executable,
    ):
        self.app = app
        self.server = server
        # Run as this (unprivileged) user, with this interpreter (one it may run).
        self.user = user
        self.python = python
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 30) -> DaphneProcess:
        if self.log_path is not None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        if self.server == "uvicorn":  # the origin's architecture, for the benchmarks
            argv = ["uvicorn", "--host", "127.0.0.1", "--port", str(self.port)]
            argv += ["--log-level", "warning", self.app]
        elif self.server == "gunicorn":  # HTTP under WSGI (Channels' second layout)
            argv = ["gunicorn", "-b", f"127.0.0.1:{self.port}", "--workers", "4", self.app]
        else:
            # Studio writes its own access lines through logging (studio.logs).
            argv = ["daphne", "-b", "127.0.0.1", "-p", str(self.port), "--access-log", os.devnull]
            argv.append(self.app)
        self.proc = subprocess.Popen(
            [self.python, "-m", *argv],
            cwd=ROOT,
            env=self.env,
            stdout=self._log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            user=self.user,
            group=None if self.user is None else _group_of(self.user),
            extra_groups=None if self.user is None else [],
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne on port {self.port} exited; see {self.log_path}")
            try:
                # Our own loopback URL, http only.
                login = self.url + "/accounts/login/"
                with urllib.request.urlopen(login, timeout=1) as r:  # noqa: S310
                    if r.status == 200:
                        return self
            except urllib.error.HTTPError:
                return self  # it answers (a peer without a login page)
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"daphne on port {self.port} did not start in {timeout}s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """kill -9: no cleanup of any kind, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, and SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--base-port", type=int, default=8001)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", ""))
    args = parser.parse_args()
    if args.processes > 1 and not (args.database_url and args.redis_url):
        parser.error("several processes need --database-url (PostgreSQL) and --redis-url")
    env = dict(os.environ, DATABASE_URL=args.database_url, REDIS_URL=args.redis_url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True
    )
    procs = [DaphneProcess(env=env, port=args.base_port + i) for i in range(args.processes)]
    try:
        for p in procs:
            p.start()
            print(f"Studio on {p.url} (pid {p.pid})", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for p in procs:
            p.stop()


if __name__ == "__main__":
    main()


def _group_of(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_gid

"""Benchmark: a python call in the conversation's session against a cold sandboxed call.

Both go through the real python tool in the real sandbox (bubblewrap, the
tools' uid, seccomp, cgroups; run as root, as CI does), with the same code,
in alternating rounds: a cold call starts a fresh interpreter in a fresh
sandbox (STUDIO_PYTHON_SESSIONS=False); a warm call is the second and later
calls of a session. The first call of a session (the start of it) is timed
too. What differs between them is all here: the rest of a run (the gate,
the rows, the page) is the same for both.

    .venv/bin/python bench/python_session.py --calls 60
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import harness


def timed(tool, code: str, workspace: Path) -> float:
    from studio.cancel import CancelToken

    started = time.perf_counter()
    result = tool.execute({"code": code}, cancel=CancelToken(), timeout=30, workspace=workspace)
    elapsed = time.perf_counter() - started
    assert result.ok, result.text
    return elapsed * 1000


def session_memory(sessions) -> list[int]:
    """Each live session's memory as its cgroup counts it (interpreter, sandbox, page cache)."""
    found = []
    for session in sessions.sessions.values():
        cgroup = session.prepared.cgroup
        if cgroup is None:
            continue
        for name in ("memory.current", "memory.usage_in_bytes"):  # cgroup v2, v1
            counter = cgroup.dirs[0] / name
            if counter.exists():
                found.append(int(counter.read_text()))
                break
    return found


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return f"median {statistics.median(ordered):7.2f} ms, p95 {p95:7.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    database = Path(tempfile.mkdtemp()) / "bench.sqlite3"
    harness.setup_django(f"sqlite:///{database}")
    from django.conf import settings

    from chat.tools import builtin_tools
    from chat.tools.sessions import SESSIONS

    root = Path("/var/lib/studio-bench-workspaces")
    root.mkdir(mode=0o711, exist_ok=True)
    settings.STUDIO_WORKSPACE_ROOT = root
    code = "total = sum(range(1000))\nprint(total)"
    cold, warm, starts = [], [], []
    for round_ in range(args.calls):
        settings.STUDIO_PYTHON_SESSIONS = False
        cold.append(
            timed(builtin_tools()["python"], code, root / f"conversation-{900_000 + round_}")
        )
        settings.STUDIO_PYTHON_SESSIONS = True
        workspace = root / f"conversation-{800_000 + round_ % 5}"
        if round_ < 5:
            starts.append(timed(builtin_tools()["python"], code, workspace))  # starts it
        warm.append(timed(builtin_tools()["python"], code, workspace))
    memory = session_memory(SESSIONS)
    SESSIONS.end_all()
    shutil.rmtree(root, ignore_errors=True)
    print(f"cold sandboxed call  {summary(cold)}  ({len(cold)} calls)")
    print(f"session's first call {summary(starts)}  ({len(starts)} calls)")
    print(f"session, later calls {summary(warm)}  ({len(warm)} calls)")
    ratio = statistics.median(cold) / statistics.median(warm)
    print(f"later call vs cold call: {ratio:.1f}x sooner (median to median)")
    if memory:
        print(
            f"memory of an idle session (as its cgroup counts it): median "
            f"{statistics.median(memory) / 2**20:.1f} MiB over {len(memory)} sessions"
        )


if __name__ == "__main__":
    main()

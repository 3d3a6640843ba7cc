"""Where a round trip's server CPU goes, thread by thread.

Studio alone (SQLite + in-memory layer), N approvals one at a time as
``roundtrip.py`` makes them. Around each round trip's window (decision POST
sent -> tool result received) it reads every server thread's CPU from
``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds) and sums it by the
thread's name (``studio-http-3`` counts as ``studio-http``). Python does not
give its threads' names to the kernel, so they are read once, after the
warm-up, from ``py-spy dump`` (``bench/requirements.txt``); a thread
started later counts as "(started later)". A diagnosis, not a goal: no
peer runs beside it.

    .venv/bin/python bench/threads.py --approvals 600
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import harness
import httpx

from deploy.cluster import DaphneProcess

THREAD = re.compile(r'Thread (\d+) \([^)]*\): "([^"]+)"')


def thread_names(pid: int) -> dict[str, str]:
    """Each thread id of ``pid`` and its pool's name (Python's, where py-spy sees it)."""
    beside = Path(sys.executable).with_name("py-spy")  # bench/requirements.txt, in the venv
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    dump = ""
    if spy:
        dump = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, check=False
        ).stdout
    python = {tid: re.sub(r"-\d+$", "", name) for tid, name in THREAD.findall(dump)}
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        kernel = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        names[tid] = python.get(tid, f"({kernel})")
    return names


class ThreadClock:
    """Every thread's CPU so far (ns), read from its open ``schedstat``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.files: dict[str, object] = {}

    def read(self) -> dict[str, int]:
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            if tid not in self.files:
                path = f"/proc/{self.pid}/task/{tid}/schedstat"
                self.files[tid] = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        now = {}
        for tid, f in list(self.files.items()):
            try:
                f.seek(0)
                now[tid] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):  # the thread ended
                self.files.pop(tid).close()
        return now

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--per-conversation", type=int, default=50)
    args = parser.parse_args()

    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-threads.sqlite3'}")
    user, session = harness.make_member(f"threads{time.monotonic_ns()}")
    server = DaphneProcess(env=harness.server_env(), app="bench.asgi:application").start()
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
    clock = ThreadClock(server.pid)
    approvals = harness.SocketCycles(
        ws_server=server,
        user=user,
        session=session,
        decide=harness.member_allow(http),
        per_conversation=args.per_conversation,
        cpu_pid=server.pid,
        read=clock.read,
    )
    try:
        for _ in range(args.warmup):
            approvals.one()
        names = thread_names(server.pid)
        trips = [approvals.one() for _ in range(args.approvals)]
    finally:
        approvals.close()
        clock.close()
        http.close()
        server.stop()

    per_thread: dict[str, list[int]] = collections.defaultdict(list)
    for trip in trips:
        before, after = trip.read
        window: collections.Counter = collections.Counter()
        for tid, ns in after.items():
            window[names.get(tid, "(started later)")] += ns - before.get(tid, 0)
        for name in set(names.values()) | set(window):
            per_thread[name].append(window[name])
    process = [trip.cpu for trip in trips]
    print(
        f"server CPU in a round trip's window, {args.approvals} approvals: "
        f"process median {statistics.median(process) * 1e6:.0f} us "
        f"(mean {statistics.fmean(process) * 1e6:.0f} us); by thread:"
    )
    for name, values in sorted(per_thread.items(), key=lambda kv: -statistics.fmean(kv[1])):
        mean, median = statistics.fmean(values) / 1000, statistics.median(values) / 1000
        print(f"  {name:<28} mean {mean:6.0f} us  median {median:6.0f} us")


if __name__ == "__main__":
    main()

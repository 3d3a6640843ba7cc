"""Where one approval round trip goes: client and server stamps on one clock.

Studio alone (SQLite + in-memory layer, as ``roundtrip.py``), served by
``bench/stamped_asgi.py``. For each of N approvals the client stamps the
POST sent (c0), its answer (cp) and the tool's result received (c1); the
server stamps each step between (see ``stamped_asgi.py``). Prints each
stamp's median offset from c0 and the median of each span, and the median
thread CPU of the Django side and of the woken run's step up to its result,
then which spans held up the slowest 3 % of the round trips. A diagnosis,
not a goal: the stamps add a little to every span, and no peer runs beside
it.

    .venv/bin/python bench/spans.py --approvals 400
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import time
from pathlib import Path

import harness
import httpx

from deploy.cluster import DaphneProcess

ORDER = ["c0", "H0", "H1", "H2", "H3", "H4", "H5", "W", "S0", "S1", "C0", "C1", "c1"]
# The server's thread CPU per POST (its Django side) and per woken run's step.
CPU_FILES = (".cpu", ".step")
SLACK = 0.0005  # server stamps this close outside a client's window still belong to it


def cycles(server, count: int, warmup: int) -> list[dict[str, float]]:
    """``count`` approvals one at a time (``harness.SocketCycles``); the client's stamps of each."""
    user, session = harness.make_member(f"spans{time.monotonic_ns()}")
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
    approvals = harness.SocketCycles(
        ws_server=server, user=user, session=session, decide=harness.member_allow(http)
    )
    try:
        trips = [approvals.one() for _ in range(warmup + count)][warmup:]
    finally:
        approvals.close()
        http.close()
    return [{"c0": t.sent, "cp": t.sent + t.post, "c1": t.sent + t.total} for t in trips]


def attach(trips: list[dict[str, float]], stamps: list[tuple[str, float]]) -> None:
    """Give each trip the first server stamp of each name inside its window."""
    for trip in trips:
        for name, t in stamps:
            if trip["c0"] - SLACK <= t <= trip["c1"] + SLACK:
                trip.setdefault(name, t)


def tail(trips: list[dict[str, float]], share: float = 0.03, stall: float = 2.0) -> None:
    """The slowest ``share`` of the round trips: which span held each one up.

    A span counts as a stall in a trip when it took ``stall`` ms more than
    its median over all trips (how the WAL checkpoints in a commit were found).
    """
    whole = sorted((t for t in trips if all(name in t for name in ORDER)), key=_total)
    slowest = whole[int(len(whole) * (1 - share)) :]
    if not slowest:
        return
    totals = ", ".join(f"{_total(t) * 1000:.1f}" for t in slowest)
    print(f"the slowest {share:.0%} ({len(slowest)}), ms: {totals}")
    for before, name in itertools.pairwise(ORDER):
        typical = statistics.median(t[name] - t[before] for t in whole)
        stalls = [t[name] - t[before] - typical for t in slowest]
        stalls = [extra for extra in stalls if extra * 1000 > stall]
        if stalls:
            extra = statistics.median(stalls) * 1000
            print(f"  {before} -> {name}: stalled in {len(stalls)}, by {extra:.2f} ms (median)")


def _total(trip: dict[str, float]) -> float:
    return trip["c1"] - trip["c0"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()

    database = harness.ROOT / "bench" / ".bench-spans.sqlite3"
    out = harness.ROOT / "bench" / ".bench-spans.stamps"
    harness.setup_django(f"sqlite:///{database}")
    for suffix in CPU_FILES:
        Path(f"{out}{suffix}").unlink(missing_ok=True)  # a crashed run's
    server = DaphneProcess(
        env=harness.server_env(STAMP_OUT=str(out)),
        app="bench.stamped_asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-spans.log",
    )
    server.start()
    try:
        trips = cycles(server, args.approvals, args.warmup)
        os.kill(server.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{out}.cpu") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.stop()
    stamps = [
        (name, float(t)) for name, t in (line.split() for line in out.read_text().splitlines())
    ]
    cpu, step = (
        [float(line) for line in Path(f"{out}{suffix}").read_text().split()][args.warmup :]
        for suffix in CPU_FILES
    )
    attach(trips, stamps)

    print(f"one approval round trip, {len(trips)} approvals, medians (ms):")
    print("  stamp  from c0   span from the stamp before")
    previous = None
    for name in ORDER:
        offsets = [(t[name] - t["c0"]) * 1000 for t in trips if name in t]
        if not offsets:
            print(f"  {name:5}  (none)")
            continue
        span = ""
        if previous is not None:
            spans = [(t[name] - t[previous]) * 1000 for t in trips if name in t and previous in t]
            span = f"  {statistics.median(spans):6.3f}  ({previous} -> {name})"
        print(f"  {name:5}  {statistics.median(offsets):7.3f}{span}")
        previous = name
    post = statistics.median((t["cp"] - t["c0"]) * 1000 for t in trips)
    print(f"  the POST's own answer at the client: {post:.3f}")
    print(f"  the Django side's thread CPU (H1 -> H4): {statistics.median(cpu) * 1e6:.0f} us")
    print(f"  the run's step's thread CPU (S0 -> S1): {statistics.median(step) * 1e6:.0f} us")
    tail(trips)
    for path in (database, out):
        for suffix in ("", "-wal", "-shm", *CPU_FILES):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


if __name__ == "__main__":
    main()

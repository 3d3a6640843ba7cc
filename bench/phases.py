"""Benchmark: where one approval's time and server CPU go, phase by phase.

One Studio process (SQLite + in-memory layer, DEBUG off), one chat tab, N
sequential approvals, as ``roundtrip.py`` makes them. Each approval's life
is cut where the client sees it change:

* launch: the message sent -> its pending card on the socket (the run's
  first step: the transcript, the model, the row, the card);
* POST: the decision POST sent -> its answer (Django, the decision, the
  woken run's work that overlaps it);
* result: the answer -> the tool's result on the socket;
* tail: the result -> the run's end on the socket (the second model turn).

and, between approvals, the same Allow POSTed on a pending row that no run
waits for and no tab shows ("POST alone"). Wall time is the client's; CPU is
the server process's, from its CPU clock (summed over all approvals).

    .venv/bin/python bench/phases.py --approvals 400
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import harness
import httpx

from deploy.cluster import DaphneProcess

PHASES = ("launch", "POST", "result", "tail", "POST alone")
# Each phase: between which of an approval's marks (see main).
SPANS = ((0, 1), (1, 2), (2, 3), (3, 4), (5, 6))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--per-conversation", type=int, default=50)
    args = parser.parse_args()

    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-phases.sqlite3'}")
    user, session = harness.make_member("phases")
    total = args.approvals + args.warmup
    spare = harness.make_pending(user, harness.make_conversation(user), total)
    server = DaphneProcess(env=harness.server_env(), app="bench.asgi:application").start()
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
    allow = harness.member_allow(http)
    wall: dict[str, list[float]] = {phase: [] for phase in PHASES}
    cpu = dict.fromkeys(PHASES, 0.0)
    ws = None
    try:
        for i in range(total):
            if i % args.per_conversation == 0:
                if ws is not None:
                    ws.close()
                ws = harness.open_chat(server, user, session)
            marks = [(time.perf_counter(), harness.cpu_seconds(server.pid))]

            def mark():
                marks.append((time.perf_counter(), harness.cpu_seconds(server.pid)))

            ws.send(json.dumps({"message": f"echo {i}"}))
            approval_id = harness.APPROVAL_ID.findall(
                harness.recv_until(ws, 'data-status="pending"')
            )[-1]
            mark()
            response = allow(approval_id)
            mark()
            harness.recv_until(ws, "data-tool-result=")
            mark()
            harness.recv_until(ws, 'data-running="false"')
            mark()
            assert response.status_code == 200, response.text
            time.sleep(0.005)  # let the run's last step hand its thread back
            mark()
            alone = allow(spare[i].approval_id)
            mark()
            assert alone.status_code == 200, alone.text
            if i < args.warmup:
                continue
            for phase, (a, b) in zip(PHASES, SPANS, strict=True):
                wall[phase].append(marks[b][0] - marks[a][0])
                cpu[phase] += marks[b][1] - marks[a][1]
    finally:
        if ws is not None:
            ws.close()
        http.close()
        server.stop()
    n = args.approvals
    print(f"one approval's phases, {n} approvals (server CPU per approval):")
    for phase in PHASES:
        print(
            f"  {phase:10s}  wall p50 {statistics.median(wall[phase]) * 1000:6.2f} ms"
            f"  CPU {cpu[phase] / n * 1000:6.2f} ms"
        )
    window = cpu["POST"] + cpu["result"]
    print(
        f"  round trip (POST + result): CPU {window / n * 1000:.2f} ms, of which the same "
        f"POST on a row nobody waits for: {cpu['POST alone'] / n * 1000:.2f} ms"
    )


if __name__ == "__main__":
    main()

"""Benchmark: does a server process's memory settle? (issue 36's soak)

The production shape (nginx, 2 daphne, PostgreSQL, Redis) for a long run
of the churn a day brings: each member in turn opens a socket on their
chat, asks for a call, decides it, reads its result and closes the socket,
again and again, while other chats stream. Each process's RSS is read from
``/proc`` and its live objects are counted by type (bench/gcprobe) as it
goes. Reported: each process's RSS over the run and its slope after the
warm-up, and the types whose live count grew the most.

    .venv/bin/python bench/soak.py --minutes 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import httpx
from production import Fleet, csrf_for, open_socket, until

from deploy.cluster import free_port
from deploy.proxy import LocalNginx

PENDING = re.compile(r'data-approval-id="([^"]+)" data-status="pending"')


class Tally:
    def __init__(self) -> None:
        self.decided = 0
        self.sockets = 0
        self.errors: list[str] = []


async def member(
    proxy, session: str, csrf: str, cids: list[int], tally: Tally, stop_at: float
) -> None:
    """Open a chat, ask for a call, decide it, read its result, close; the next chat."""
    headers = {**harness.member_headers(session, csrf), "Origin": proxy.url}
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as http:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            # Round the member's chats: a transcript grows slowly, as a day's do.
            cid = cids[n % len(cids)]
            try:
                ws, _ = await open_socket(proxy, session, cid, stop_at + 60)
            except Exception as exc:
                tally.errors.append(f"socket {type(exc).__name__}")
                continue
            tally.sockets += 1
            try:
                await ws.send(json.dumps({"message": f"echo soak-{cid}-{n}"}))
                card = await until(ws, 'data-status="pending"', 30)
                found = PENDING.search(card)
                if found is None:
                    tally.errors.append("no card")
                    continue
                reply = await http.post(
                    f"/approvals/{found[1]}/decide/", data={"decision": "allow"}, headers=headers
                )
                if reply.status_code != 200:
                    tally.errors.append(f"POST {reply.status_code}")
                    continue
                await until(ws, f"soak-{cid}-{n}</", 30)
                tally.decided += 1
            except Exception as exc:
                tally.errors.append(type(exc).__name__)
            finally:
                await ws.close()


async def stream(proxy, session: str, cid: int, tally: Tally, stop_at: float, pace: float) -> None:
    while time.monotonic() < stop_at:
        try:
            ws, _ = await open_socket(proxy, session, cid, stop_at + 60)
        except Exception as exc:
            tally.errors.append(f"stream socket {type(exc).__name__}")
            continue
        try:
            await ws.send(harness.stream_request(500, pace))
            await until(ws, 'data-running="false"', 60)
        except Exception as exc:
            tally.errors.append(f"stream {type(exc).__name__}")
        finally:
            await ws.close()


def sample(fleet: Fleet, samples: dict, tally: Tally, started: float, every: float, stop) -> None:
    while not stop.wait(every):
        for server in fleet.servers:
            samples.setdefault(server.pid, []).append(
                (
                    time.monotonic() - started,
                    harness.rss_kb(server.pid),
                    harness.threads(server.pid),
                )
            )


def slope_mb_per_hour(points: list[tuple[float, int, int]]) -> float:
    """Least squares over the points (seconds, KB)."""
    xs = [p[0] for p in points]
    ys = [p[1] / 1024 for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 3600


def census_after(census: Path, since: float) -> dict:
    """Between the first census after ``since`` and the last: the live objects
    in all, the allocator's blocks, and the types whose count grew most."""
    lines = [json.loads(line) for line in census.read_text().splitlines()]
    lines = [line for line in lines if line["at"] >= since]
    if len(lines) < 2:
        return {}
    first, last = lines[0]["types"], lines[-1]["types"]
    grown = [(t, first.get(t, 0), n) for t, n in last.items() if n > first.get(t, 0)]
    return {
        "objects": (sum(first.values()), sum(last.values())),
        "blocks": (lines[0].get("blocks", 0), lines[-1].get("blocks", 0)),
        "grown": sorted(grown, key=lambda g: g[2] - g[1], reverse=True)[:8],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--members", type=int, default=50)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--chats-each", type=int, default=10, help="each member's chats, in turn")
    parser.add_argument("--stream-pace", type=float, default=100, help="each stream's tokens/s")
    parser.add_argument("--every", type=float, default=30, help="seconds between samples")
    parser.add_argument("--warm-up", type=float, default=0.2, help="share of the run left out")
    args = parser.parse_args()
    subprocess.run(["redis-cli", "-n", "5", "flushdb"], check=True, capture_output=True)
    harness.setup_django(harness.POSTGRES_URL, harness.REDIS_URL)
    with tempfile.TemporaryDirectory(prefix="studio-soak-") as tmp:
        work = Path(tmp)
        static = work / "static"
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
            cwd=harness.ROOT, env=harness.server_env(STUDIO_STATIC_ROOT=str(static)), check=True,
        )  # fmt: skip
        probes = work / "probes"
        probes.mkdir()
        env = harness.server_env(
            STUDIO_HTTPS="True", STUDIO_APPROVAL_POLL_SECONDS="1",
            PYTHONPATH=f"{harness.ROOT}:{harness.ROOT / 'bench' / 'gcprobe'}",
            STUDIO_BENCH_GC_DIR=str(probes), STUDIO_BENCH_CENSUS_SECONDS=str(args.every),
        )  # fmt: skip
        fleet = Fleet(env, [free_port(), free_port()], harness.ROOT / "bench")
        prefix = work / "nginx"
        prefix.mkdir()
        proxy = LocalNginx(prefix, [s.port for s in fleet.servers], static, tls=False).start()
        tally, samples, stop = Tally(), {}, threading.Event()
        try:
            people = [harness.make_member(f"soak{n}") for n in range(args.members + args.streams)]
            deciders, streamers = people[: args.members], people[args.members :]
            members = [
                (
                    s,
                    csrf_for(proxy, s),
                    [harness.make_conversation(u).pk for _ in range(args.chats_each)],
                )
                for u, s in deciders
            ]
            chats = [(s, harness.make_conversation(u).pk) for u, s in streamers]
            started = time.monotonic()
            stop_at = started + args.minutes * 60
            sampler = threading.Thread(
                target=sample, args=(fleet, samples, tally, started, args.every, stop)
            )
            sampler.start()
            warm_at = time.time() + args.minutes * 60 * args.warm_up

            async def run() -> None:
                await asyncio.gather(
                    *(member(proxy, *m, tally, stop_at) for m in members),
                    *(stream(proxy, s, cid, tally, stop_at, args.stream_pace) for s, cid in chats),
                )

            asyncio.run(run())
        finally:
            stop.set()
            proxy.stop()
            fleet.stop()
        print(
            f"Soak: 2 daphne behind nginx, PostgreSQL + Redis, {args.minutes:g} min; "
            f"{args.members} members in a loop (socket, call, decision, result, close), "
            f"{args.streams} chats streaming at {args.stream_pace:g} tok/s"
        )
        print(
            f"  {tally.decided} decisions, {tally.sockets} sockets opened; "
            f"errors {len(tally.errors)} {sorted(set(tally.errors))}"
        )
        warm = args.minutes * 60 * args.warm_up
        for pid, points in samples.items():
            after = [p for p in points if p[0] >= warm]
            print(
                f"  process {pid}: RSS {points[0][1] / 1024:.0f} MB at {points[0][0]:.0f} s, "
                f"{after[0][1] / 1024:.0f} MB after the warm-up, {points[-1][1] / 1024:.0f} MB "
                f"at the end; slope after the warm-up {slope_mb_per_hour(after):+.1f} MB/hour"
            )
            print("    RSS (MB) each sample: " + " ".join(f"{p[1] / 1024:.0f}" for p in points))
            print("    threads each sample: " + " ".join(str(p[2]) for p in points))
            census = probes / f"{pid}-census.jsonl"
            found = census_after(census, warm_at) if census.exists() else {}
            if found:
                (o0, o1), (b0, b1) = found["objects"], found["blocks"]
                print(
                    f"    after the warm-up: live objects {o0:,} -> {o1:,}, allocator blocks "
                    f"{b0:,} -> {b1:,}; grown most: "
                    + (", ".join(f"{t} {a}->{b}" for t, a, b in found["grown"]) or "none")
                )


if __name__ == "__main__":
    main()

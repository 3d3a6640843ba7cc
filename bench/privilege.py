"""Benchmark: what a tool call costs with the web process as root, and as an
unprivileged user (issue 53's privilege split), in one invocation.

Each side is a child process serving the real ``terminal`` tool (the real
sandbox: bubblewrap, seccomp, a memory and a pids cgroup per call), on the
same interpreter (Debian's python3 with the venv's packages), in alternating
rounds:

* root: a uid of the conversation's own (setpriv), cgroups below its own;
* split: ``nobody`` with unprivileged user namespaces, per-call cgroups below
  the subtree ``deploy/bin/studio-cgroups`` made and handed over.

A call runs ``true``: what is timed is the sandbox's start and end, wall
time and CPU (the child's and its children's) per call.

    .venv/bin/python bench/privilege.py --calls 40 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELPER = ROOT / "deploy" / "bin" / "studio-cgroups"
PYTHON = "/usr/bin/python3"
USER = "nobody"

CHILD = """
import json, os, resource, sys, time
import django
django.setup()
from pathlib import Path
from chat.tools import builtin_tools
from studio.cancel import CancelToken
tool = builtin_tools()["terminal"]
workspace = Path(os.environ["STUDIO_WORKSPACE_ROOT"]) / "conversation-1"
samples = []
for _ in range(int(sys.argv[1]) + 2):
    before = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    started = time.perf_counter()
    result = tool.execute({"command": "true"}, cancel=CancelToken(), timeout=30,
                          workspace=workspace)
    wall = time.perf_counter() - started
    after = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    assert result.ok, result.text
    cpu = sum(a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before))
    samples.append((wall * 1000, cpu * 1000))
print(json.dumps(samples[2:]))  # the first two warm the caches
"""


def side_env(base: Path, *, user: str | None, cgroup: str | None) -> dict[str, str]:
    site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    folders = {name: base / name for name in ("workspaces", "media", "home")}
    for folder in folders.values():
        folder.mkdir(parents=True)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{site}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "studio.settings",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": f"sqlite:///{base / 'unused.sqlite3'}",
        "STUDIO_WORKSPACE_ROOT": str(folders["workspaces"]),
        "STUDIO_MEDIA_ROOT": str(folders["media"]),
        "HOME": str(folders["home"]),
    }
    if cgroup:
        env["STUDIO_TOOL_CGROUP"] = cgroup
    return env


def run_side(env: dict[str, str], calls: int, user: str | None) -> list[tuple[float, float]]:
    done = subprocess.run(
        [PYTHON, "-c", CHILD, str(calls)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, user=user,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return [tuple(s) for s in json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: one side is root, the other switches to nobody")
    base = ROOT / ".bench-privilege"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o711)
    cgroup = f"studio-bench-{secrets.token_hex(3)}"
    subprocess.run([HELPER, cgroup, USER], check=True)
    try:
        sides = {
            "root (today)": (side_env(base / "root", user=None, cgroup=None), None),
            "nobody + userns + handed cgroup": (
                side_env(base / "split", user=USER, cgroup=cgroup),
                USER,
            ),
        }
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, (env, user) in sides.items():
                samples[name] += run_side(env, args.calls, user)
    finally:
        subprocess.run([HELPER, "--remove", cgroup], check=True)
        shutil.rmtree(base, ignore_errors=True)
    medians = {}
    for name, values in samples.items():
        wall = sorted(w for w, _ in values)
        cpu = [c for _, c in values]
        medians[name] = statistics.median(wall)
        print(
            f"{name:34} wall median {statistics.median(wall):6.2f} ms, "
            f"p95 {wall[int(0.95 * (len(wall) - 1))]:6.2f} ms; "
            f"CPU median {statistics.median(cpu):6.2f} ms  ({len(values)} calls)"
        )
    root, split = medians.values()
    print(f"split / root, wall median: {split / root:.2f}x")


if __name__ == "__main__":
    sys.exit(main())

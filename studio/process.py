"""What a server process does once its application is built."""

from __future__ import annotations

import gc
import os
from pathlib import Path

from django.conf import settings
from django.template.loader import get_template
from django.urls import reverse

# Container objects allocated (net of those freed) between two young
# collections. Each request leaves cycles (Django's connection wrapper per
# request context, daphne's protocol objects): at Python's 700 those of the
# requests in flight were promoted and collected in full, with the process
# stopped; ten times later most are garbage by then (bench/RESULTS.md).
YOUNG_THRESHOLD = 7000


def settle() -> None:
    """Keep what the process built as it started out of full collections.

    Django, every module and the URL maps live as long as the process, yet
    each full collection walked them all, with the process stopped
    (bench/RESULTS.md). Frozen, they are never walked again; their garbage
    is collected first, since frozen objects are never freed.
    """
    warm_up()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def warm_up() -> None:
    """Build now what Django builds lazily on first use, so that the first
    requests after a start (a deploy's) cost what later ones do, and what is
    built is frozen with the rest: the URL maps (importing every view) and
    the compiled templates. A broken template stops the start, not a request."""
    for name in ("chat:index", "approvals:inbox", "admin:index"):
        reverse(name)  # each namespace builds its own map on its first use
    compile_templates()


def compile_templates() -> list[str]:
    """Compile the project's own templates into the cached loader; their names."""
    names = []
    for config in settings.TEMPLATES:
        for directory in map(Path, config.get("DIRS", [])):
            names += [p.relative_to(directory).as_posix() for p in directory.rglob("*.html")]
    for name in sorted(names):
        get_template(name)
    return names


def identity() -> str:
    """Where this process runs, as its runs' rows name it: the host's boot, its
    pid namespace, its pid and its start time; "" where /proc cannot tell.
    Read once per pid: a forked child is not its parent."""
    pid = os.getpid()
    if pid not in _identities:
        _identities.clear()
        _identities[pid] = _describe(pid) or ""
    return _identities[pid]


def this_host() -> str:
    """The prefix every identity of a process this one can look up begins with
    (this host's boot and pid namespace, then "/"); "" where /proc cannot tell."""
    here = identity()
    return here.rsplit("/", 2)[0] + "/" if here else ""


def gone(process: str) -> bool:
    """Whether the process ``identity()`` named has surely exited: only a process
    of this host's boot and pid namespace can be looked up; any other may be
    alive (its heartbeat says when it is not)."""
    host = this_host()
    if not host or process == identity() or not process.startswith(host):
        return False
    pid, _, started = process.removeprefix(host).partition("/")
    if not (pid.isdigit() and started.isdigit()):
        return False
    return _describe(int(pid)) != process


_identities: dict[int, str] = {}


def _describe(pid: int) -> str | None:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
        # The start time (in clock ticks since boot) tells a pid reused by a
        # later process apart; it is the 20th field after the command's ")".
        started = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None
    return f"{boot}/{namespace}/{pid}/{started}"

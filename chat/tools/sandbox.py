"""Run a tool's program in an isolation layer built from bubblewrap.

Every ``python`` and ``terminal`` call runs as::

    [join cgroups] bwrap <namespaces, mounts> -- setpriv <uid> -- prlimit <rlimits> -- argv

What a call gets (each is tested in ``tests/chat/test_sandbox.py``):

* **no network**: its own network namespace holds only a loopback interface
  of its own, so neither the internet nor the host's 127.0.0.1 (Redis,
  PostgreSQL, Studio) nor its other addresses are reachable;
* **its own processes only**: a PID namespace whose init is bubblewrap's;
  when the program ends, times out or is stopped, the namespace dies and
  takes every process started in it (double forks, ``setsid``, ``nohup``);
* **a read-only system** (``/usr``, ``/etc``, the interpreter), a fresh
  ``/proc`` and ``/dev``, and private, size-capped tmpfs mounts on ``/tmp``,
  ``/var/tmp`` and ``/dev/shm``; only the conversation's workspace is
  writable, and it is the only part of the host's disk it sees besides the
  read-only system;
* **per-call memory and process caps**: a memory cgroup and a pids cgroup
  made for the call (all its processes and its tmpfs pages count together),
  where the machine lets us create one; otherwise ``RLIMIT_AS`` per process
  (weaker: per process, not per call; see README);
* **a workspace quota**: a soft quota checked before and every second during
  the call (the call is killed when it passes it), plus a hard per-file cap
  (``RLIMIT_FSIZE``) that never exceeds what is left of the quota;
* a clean environment (none of the server's variables), CPU-time and
  open-file limits, no core dumps;
* when the server runs as root, an unprivileged uid of the conversation's
  own (``SANDBOX_UID_BASE + conversation id``) with no capabilities and
  ``no_new_privs``, so the workspace (mode 0700) of one conversation is
  unreadable to another's tools.

``STUDIO_SANDBOX=none`` turns all of this off (an admin's explicit choice,
logged loudly at start): the program then runs as a plain subprocess with
rlimits only. Without bubblewrap and without that opt-out, tools refuse to
run and say what to install.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path, PurePosixPath
from typing import IO

from django.conf import settings

from chat.tools.base import Progress, ToolResult
from chat.tools.images import keep, notice_for, produced, snapshot
from studio.cancel import CancelToken
from studio.metrics import SANDBOX_FAILURES
from studio.shell import PROGRAM_PATH
from studio.text import strip_nul

logger = logging.getLogger(__name__)

OUTPUT_CAP = 64 * 1024
# An output cut at OUTPUT_CAP is kept whole, up to this, as a workspace file.
WHOLE_OUTPUT_CAP = 16 * 1024 * 1024
WHOLE_OUTPUT_DIR = "tool-output"
# A running call's latest output goes to its card at most this often, and
# only its last LIVE_BYTES: enough for the last screenful.
LIVE_SECONDS = 0.25
LIVE_BYTES = 8 * 1024
SANDBOX_UID_BASE = 200_000
MB = 1024 * 1024
_CONVERSATION_DIR = re.compile(r"^conversation-(\d+)$")
# The host paths a call sees read-only; the rest of the host does not exist in it.
_SYSTEM_BINDS = ("/usr", "/etc")
# Debian's merged /usr: these are symlinks on the host and in the sandbox.
_USR_LINKS = {"/bin": "usr/bin", "/sbin": "usr/sbin", "/lib": "usr/lib", "/lib64": "usr/lib64"}
# The workspace quota is soft: a call is stopped once it has passed it, by at
# most QUOTA_SLACK. Usage is checked sooner the nearer it is to that bound,
# at the fastest rate the call has written so far (QUOTA_RATE at least).
QUOTA_SLACK = 64 * 1024 * 1024
QUOTA_RATE = 1024 * 1024 * 1024
_QUOTA_CHECK_SECONDS = (0.01, 1.0)
INSTALL_HINT = (
    "Error: tools cannot run: the sandbox tool bubblewrap (bwrap) is not installed. "
    "Ask an admin to install it (Debian/Ubuntu: apt-get install bubblewrap) or, knowingly, "
    "to run tools without isolation (STUDIO_SANDBOX=none)."
)


class SandboxUnavailable(Exception):
    """The isolation layer cannot be set up; the message tells the user why."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 512 * MB
    tmp_bytes: int = 64 * MB
    file_bytes: int = 16 * MB
    workspace_bytes: int = 256 * MB
    processes: int = 64
    open_files: int = 256


@dataclass
class SandboxResult:
    output: str
    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    truncated_bytes: int = 0
    # The whole output (a temporary file), when it was cut at OUTPUT_CAP.
    whole: IO[bytes] | None = None
    out_of_memory: bool = False
    over_quota: bool = False
    quota_bytes: int = 0

    def as_text(self, *, timeout: float) -> str:
        return self.as_result(timeout=timeout).text

    def as_result(self, *, timeout: float) -> ToolResult:
        text = self.output
        if self.truncated_bytes:
            text += f"\n[output truncated: {self.truncated_bytes} more bytes not shown]"
        failure = ""
        if self.timed_out:
            problem, failure = f"timed out after {timeout:g} s and was killed.", "timeout"
        elif self.cancelled:
            problem = "stopped by the user."
        elif self.over_quota:
            problem = (
                f"the workspace passed its quota of {self.quota_bytes // MB} MB and the "
                "call was killed; delete files to free space."
            )
            failure = "quota"
        elif self.out_of_memory:
            problem, failure = "killed: the call used more than its memory limit.", "memory"
        elif self.exit_code:
            problem = f"exited with {_describe_exit(self.exit_code)}."
            if _NO_NETWORK.search(text):
                problem += f" {NO_NETWORK_NOTE}"
                failure = "network"
        else:
            return ToolResult(text if text.strip() else "(no output)")
        if failure:
            SANDBOX_FAILURES.labels(failure).inc()
        return replace(ToolResult.error(f"{problem}\n{text}".rstrip()), stopped=self.cancelled)


# What programs print when a name does not resolve or nothing answers: in the
# sandbox, that is because there is no network at all.
_NO_NETWORK = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Name or service not known"
    r"|No address associated with hostname|Network is unreachable|getaddrinfo failed"
    r"|Failed to establish a new connection|Failed to connect to|Connection refused"
    r"|unable to resolve host",
    re.IGNORECASE,
)
NO_NETWORK_NOTE = (
    "Tools run without a network (no internet, no local services), so this call could not "
    "reach what it asked for; use web_fetch for a web page."
)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    if code > 128:
        # bwrap reports a program killed by a signal as 128 + signal.
        try:
            return f"signal {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"status {code}"


# --- what this machine offers ----------------------------------------------------------


def sandbox_python() -> str:
    """The interpreter of the ``python`` tool (STUDIO_SANDBOX_PYTHON).

    The system's by default: the sandbox shows it read-only at its own path,
    and it is readable by the tool's uid (the server's own interpreter may
    live in a private home such as /root/.pyenv).
    """
    configured = os.environ.get("STUDIO_SANDBOX_PYTHON")
    if configured:
        return configured
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    return sys.executable


def sandbox_mode() -> str:
    """``bwrap`` (the default) or ``none`` (STUDIO_SANDBOX=none: no isolation)."""
    from django.conf import settings

    return settings.STUDIO_SANDBOX


def can_drop_privileges() -> bool:
    return os.geteuid() == 0


@cache
def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@dataclass(frozen=True)
class CgroupRoot:
    """Where per-call cgroups are made: one directory per controller."""

    version: int
    memory: Path
    pids: Path | None


@cache
def cgroup_root() -> CgroupRoot | None:
    """A writable place for per-call memory (and pids) cgroups, or None.

    ``STUDIO_TOOL_CGROUP``: a subtree a small privileged helper prepared and
    handed to this process's user (``deploy/systemd/studio-cgroups.service``),
    as the memory and pids controllers' ``<name>`` (cgroup v1). Otherwise,
    cgroup v1: below this process's own memory and pids cgroups. cgroup v2:
    below this process's cgroup when it delegates the memory controller to
    its children (e.g. a systemd unit with ``Delegate=yes``).
    """
    from django.conf import settings

    if settings.STUDIO_TOOL_CGROUP:
        memory = _probe_dir(Path("/sys/fs/cgroup/memory") / settings.STUDIO_TOOL_CGROUP, "")
        if memory is None:
            return None
        pids = _probe_dir(Path("/sys/fs/cgroup/pids") / settings.STUDIO_TOOL_CGROUP, "")
        return CgroupRoot(version=1, memory=memory, pids=pids)
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    own: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    if "memory" in own:
        memory = _probe_dir(Path("/sys/fs/cgroup/memory") / own["memory"].lstrip("/"))
        if memory is None:
            return None
        pids = None
        if "pids" in own:
            pids = _probe_dir(Path("/sys/fs/cgroup/pids") / own["pids"].lstrip("/"))
        return CgroupRoot(version=1, memory=memory, pids=pids)
    if "" in own:
        base = Path("/sys/fs/cgroup") / own[""].lstrip("/")
        try:
            delegated = (base / "cgroup.subtree_control").read_text().split()
        except OSError:
            return None
        if "memory" not in delegated:
            return None
        root = _probe_dir(base)
        if root is None:
            return None
        return CgroupRoot(version=2, memory=root, pids=root if "pids" in delegated else None)
    return None


def _probe_dir(parent: Path, name: str = "studio-tools") -> Path | None:
    """``parent/name`` if we may create cgroups there (``name`` "": ``parent``,
    which must exist: a helper made it)."""
    root = parent / name if name else parent
    try:
        if name:
            root.mkdir(exist_ok=True)
        probe = root / f"probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    return root


def check_available() -> None:
    """Raise ``SandboxUnavailable`` when tools must refuse to run."""
    if sandbox_mode() == "none":
        return
    if bwrap_path() is None:
        raise SandboxUnavailable(INSTALL_HINT)


def describe() -> str:
    """One line for the start-up log: what isolation tools get here."""
    if sandbox_mode() == "none":
        return "NO ISOLATION (STUDIO_SANDBOX=none): tools run as plain subprocesses"
    if bwrap_path() is None:
        return "bubblewrap is missing: tools refuse to run until it is installed"
    root = cgroup_root()
    memory = f"per-call cgroup v{root.version}" if root else "per-process RLIMIT_AS (no cgroup)"
    uid = "own uid per conversation" if can_drop_privileges() else "the server's uid"
    return f"bubblewrap at {bwrap_path()}; memory: {memory}; {uid}"


# --- workspaces --------------------------------------------------------------------------


def sandbox_ids(workspace: Path) -> tuple[int, int] | None:
    """The uid/gid a tool of this workspace runs as, or None without root."""
    if not can_drop_privileges():
        return None
    match = _CONVERSATION_DIR.match(workspace.name)
    if match:
        offset = int(match.group(1)) % 1_000_000_000
    else:
        offset = 1_000_000_000 + zlib.crc32(str(workspace).encode()) % 100_000_000
    uid = SANDBOX_UID_BASE + offset
    return uid, uid


def prepare_workspace(path: Path) -> Path:
    """Create the working folder, private to the uid its tools run as."""
    path.mkdir(parents=True, exist_ok=True)
    ids = sandbox_ids(path)
    if ids is not None:
        os.chown(path, *ids)
        path.chmod(0o700)
        # The root of all workspaces must be traversable (not listable).
        path.parent.chmod((path.parent.stat().st_mode | 0o111) & ~0o066)
    return path


def workspace_usage(path: Path, *, stop_above: int | None = None) -> int:
    """Bytes used under ``path`` (stops counting once past ``stop_above``)."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        # Allocated blocks, so sparse files count as what they cost.
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
                if stop_above is not None and total > stop_above:
                    return total
    return total


# git reads programs to run from a workspace's .git/config, which any earlier
# call may have written: these settings win over it (as ``git -c`` would), so
# an approved ``git status`` is git status, not a hook or a monitor.
GIT_PINNED = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.pager": "cat",
    "core.editor": "false",
    "core.sshCommand": "false",
}


def clean_env(workspace: Path) -> dict[str, str]:
    """Built from nothing, never copied from the server's environment."""
    env = {
        "PATH": PROGRAM_PATH,
        "HOME": str(workspace),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        # Caches in the call's own tmpfs mounts, never the member's workspace (where
        # they cluttered the files and warned with the host's path); the font
        # lists come warmed (``font_caches``).
        "MPLCONFIGDIR": MPL_DIR,
        "XDG_CACHE_HOME": "/tmp/.cache",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_COUNT": str(len(GIT_PINNED)),
    }
    for n, (key, value) in enumerate(GIT_PINNED.items()):
        env[f"GIT_CONFIG_KEY_{n}"] = key
        env[f"GIT_CONFIG_VALUE_{n}"] = value
    return env


# --- per-call cgroups ----------------------------------------------------------------------


@dataclass
class CallCgroup:
    """The cgroups of one call: made before it starts, emptied and removed after."""

    root: CgroupRoot
    limits: Limits
    name: str = field(default_factory=lambda: f"call-{secrets.token_hex(6)}")
    dirs: list[Path] = field(default_factory=list)

    def create(self) -> list[Path]:
        """Make the cgroups and set their limits; returns their ``cgroup.procs`` files."""
        memory = self.root.memory / self.name
        memory.mkdir()
        self.dirs.append(memory)
        if self.root.version == 1:
            (memory / "memory.limit_in_bytes").write_text(str(self.limits.memory_bytes))
            # No swap here, but where there is some it must not extend the cap.
            with contextlib.suppress(OSError):
                (memory / "memory.memsw.limit_in_bytes").write_text(str(self.limits.memory_bytes))
        else:
            (memory / "memory.max").write_text(str(self.limits.memory_bytes))
            with contextlib.suppress(OSError):
                (memory / "memory.swap.max").write_text("0")
        if self.root.pids is not None:
            pids = self.root.pids / self.name
            if pids != memory:
                pids.mkdir()
                self.dirs.append(pids)
            (pids / "pids.max").write_text(str(self.limits.processes))
        return [d / "cgroup.procs" for d in self.dirs]

    def out_of_memory(self) -> bool:
        memory = self.dirs[0]
        try:
            if self.root.version == 1:
                control = (memory / "memory.oom_control").read_text()
                kills = re.search(r"oom_kill (\d+)", control)
                failed = int((memory / "memory.failcnt").read_text())
                return bool(kills and int(kills.group(1))) or failed > 0
            events = (memory / "memory.events").read_text()
            kills = re.search(r"oom_kill (\d+)", events)
            return bool(kills and int(kills.group(1)))
        except (OSError, IndexError):
            return False

    def kill_all(self) -> None:
        """SIGKILL whatever is left in the call's cgroups."""
        for _ in range(100):
            pids = set()
            for d in self.dirs:
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the last process is still being reaped


# A shell that joins the cgroups given before "--" and then becomes the command:
# the first instruction of the call already runs inside its cgroups.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


# --- building the command line ---------------------------------------------------------------


# The namespaces of every sandbox (tool calls and MCP servers): its own
# processes, IPC and host name; it dies with whoever started it.
NAMESPACES = (
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--die-with-parent",
    "--new-session",
)


def drop_to(uid: int, gid: int) -> list[str]:
    """The command prefix that leaves root for ``uid`` with no capability left."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def system_view() -> list[str]:
    """bubblewrap's arguments for the read-only system every sandbox sees."""
    view: list[str] = []
    for path in _SYSTEM_BINDS:
        view += ["--ro-bind", path, path]
    for link, target in _USR_LINKS.items():
        if os.path.islink(link):
            view += ["--symlink", target, link]
        elif os.path.isdir(link):
            view += ["--ro-bind", link, link]
    return view


def _interpreter_binds(argv: list[str]) -> list[str]:
    """A configured interpreter outside /usr is bound read-only with its prefix."""
    program = Path(argv[0])
    if not program.is_absolute():
        return []
    resolved = program.resolve()
    if any(str(resolved).startswith(p + "/") for p in _SYSTEM_BINDS):
        return []
    prefix = resolved.parent.parent
    if str(prefix) in ("/", ""):
        return []
    return ["--ro-bind", str(prefix), str(prefix)]


# Where matplotlib keeps its config and font list in a call: a small tmpfs of
# the call's own, apart from its /tmp (which the call finds empty).
MPL_DIR = "/run/matplotlib"


@cache
def font_caches() -> list[str]:
    """bubblewrap's arguments that show a call the system's fontconfig cache and
    a matplotlib font list built once, so a plot neither rebuilds them (seconds)
    nor prints fontconfig's and matplotlib's complaints about where to write.

    The font list is built by the tools' interpreter on the host (Debian's
    matplotlib over the same read-only fonts the calls see), once per host,
    kept beside the workspaces; none when that interpreter has no matplotlib.
    """
    from django.conf import settings

    found: list[str] = ["--ro-bind-try", "/var/cache/fontconfig", "/var/cache/fontconfig"]
    found += ["--size", str(8 * MB), "--perms", "1777", "--tmpfs", MPL_DIR]
    folder = settings.STUDIO_WORKSPACE_ROOT.parent / "tool-cache" / "matplotlib"
    lists = sorted(folder.glob("fontlist-v*.json"))
    if not lists:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sandbox_python(), "-I", "-c", "import matplotlib.font_manager"],
                env={"PATH": "/usr/bin:/bin", "MPLCONFIGDIR": str(folder), "HOME": str(folder)},
                capture_output=True,
                timeout=120,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            # No matplotlib there, or no folder we may write: plots build their own.
            logger.info("no matplotlib font list for the tools: plots build their own")
        lists = sorted(folder.glob("fontlist-v*.json"))
    if lists:
        with contextlib.suppress(OSError):  # (made by another user: readable already)
            folder.chmod(0o755)
            lists[-1].chmod(0o644)
        found += ["--ro-bind", str(lists[-1]), f"{MPL_DIR}/{lists[-1].name}"]
    return found


# Each call gets its own, empty and size-capped. A workspace (or interpreter)
# below one of them would show its path there: keep them elsewhere.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def under_private_dir(path: Path) -> bool:
    resolved = str(Path(path).resolve())
    return any(resolved == d or resolved.startswith(d + "/") for d in PRIVATE_DIRS)


# A seccomp filter (classic BPF, as bubblewrap's --seccomp reads it) that
# refuses the calls which take disk space faster than any watch can see:
# fallocate (glibc's posix_fallocate then writes, at the disk's pace) and
# io_uring (which would do the same behind the filter's back). A program
# built for another ABI of the machine gets no system calls at all.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 285, 425), "aarch64": (0xC00000B7, 47, 425)}
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_ENOSYS, _EOPNOTSUPP = 38, 95


@cache
def seccomp_program() -> bytes | None:
    """The filter's instructions for this machine (None where its numbers are unknown)."""
    known = _SECCOMP_ARCH.get(os.uname().machine)
    if known is None:
        return None
    arch, fallocate, io_uring_setup = known
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    program = [
        (ld, 0, 0, 4),  # the call's ABI
        (jeq, 1, 0, arch),
        (ret, 0, 0, _RET_ERRNO | _ENOSYS),
        (ld, 0, 0, 0),  # the call's number
        (jge, 6, 0, 0x40000000),  # x32 calls on x86_64
        (jeq, 4, 0, fallocate),
        (jeq, 4, 0, io_uring_setup),
        (jeq, 3, 0, io_uring_setup + 1),  # io_uring_enter
        (jeq, 2, 0, io_uring_setup + 2),  # io_uring_register
        (ret, 0, 0, _RET_ALLOW),
        (ret, 0, 0, _RET_ERRNO | _EOPNOTSUPP),
        (ret, 0, 0, _RET_ERRNO | _ENOSYS),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def seccomp_fd() -> int | None:
    """A file holding the filter, for one call's bubblewrap to read (the caller closes it)."""
    program = seccomp_program()
    if program is None:
        return None
    fd = os.memfd_create("studio-seccomp")
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def bwrap_argv(
    argv: list[str],
    *,
    workspace: Path,
    limits: Limits,
    cpu_seconds: int,
    file_bytes: int,
    ids: tuple[int, int] | None,
    memory_rlimit: bool,
    seccomp: int | None = None,
) -> list[str]:
    bwrap = bwrap_path()
    assert bwrap is not None
    command = [bwrap, "--unshare-net", *NAMESPACES, "--hostname", "sandbox"]
    if not can_drop_privileges():
        # Unprivileged: bubblewrap needs a user namespace of its own.
        command.append("--unshare-user")
    command += system_view()
    command += _interpreter_binds(argv)
    command += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in PRIVATE_DIRS:
        command += ["--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", tmp]
    command += font_caches()
    # The workspace's parents exist in the sandbox only as the way to it:
    # traversable, as on the host, so programs that resolve their folder's
    # real path (git) work as the tool's uid.
    for parent in reversed(workspace.parents[:-1]):
        command += ["--perms", "0711", "--dir", str(parent)]
    command += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace)]
    if seccomp is not None:
        command += ["--seccomp", str(seccomp)]
    command.append("--clearenv")
    for name, value in clean_env(workspace).items():
        command += ["--setenv", name, value]
    command.append("--")
    if ids is not None:
        command += drop_to(*ids)
    command += [
        "prlimit",
        f"--cpu={cpu_seconds}:{cpu_seconds + 1}",
        f"--fsize={file_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]
    if memory_rlimit:
        command.append(f"--as={limits.memory_bytes}")
    if ids is not None:
        # Without a pids cgroup this is the cap; per uid, so per conversation.
        command.append(f"--nproc={limits.processes}")
    return [*command, "--", *argv]


def plain_argv(argv: list[str], *, limits: Limits, cpu_seconds: int, file_bytes: int) -> list[str]:
    """STUDIO_SANDBOX=none: rlimits only (``_run`` gives it a session of its own)."""
    return [
        "prlimit",
        f"--cpu={cpu_seconds}:{cpu_seconds + 1}",
        f"--fsize={file_bytes}",
        f"--nofile={limits.open_files}",
        f"--as={limits.memory_bytes}",
        "--core=0",
        "--",
        *argv,
    ]


# --- running -------------------------------------------------------------------------------


def default_limits() -> Limits:
    from django.conf import settings

    return Limits(
        memory_bytes=settings.STUDIO_TOOL_MEMORY_MB * MB,
        tmp_bytes=settings.STUDIO_TOOL_TMP_MB * MB,
        workspace_bytes=settings.STUDIO_WORKSPACE_QUOTA_MB * MB,
    )


def run_sandboxed(
    argv: list[str],
    *,
    workspace: Path,
    timeout: float,
    cancel: CancelToken | None = None,
    stdin: str | None = None,
    limits: Limits | None = None,
    progress: Progress | None = None,
) -> SandboxResult:
    """Run ``argv`` isolated; raises ``SandboxUnavailable`` when it cannot be.
    ``progress`` hears its latest output while it runs."""
    limits = limits or default_limits()
    prepared = prepare(argv, workspace=workspace, limits=limits, cpu_seconds=int(timeout) + 1)
    try:
        return _run(
            prepared.command,
            pass_fds=prepared.pass_fds,
            workspace=workspace,
            timeout=timeout,
            cancel=cancel,
            stdin=stdin,
            limits=limits,
            cgroup=prepared.cgroup,
            used=prepared.used,
            progress=progress,
        )
    finally:
        prepared.release()


@dataclass
class Prepared:
    """A sandboxed command line and what it holds until its process is gone."""

    command: list[str]
    pass_fds: tuple[int, ...]
    cgroup: CallCgroup | None
    used: int  # the workspace's bytes when it was prepared

    def release(self) -> None:
        for fd in self.pass_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pass_fds = ()
        if self.cgroup is not None:
            self.cgroup.remove()


def prepare(argv: list[str], *, workspace: Path, limits: Limits, cpu_seconds: int) -> Prepared:
    """The command that runs ``argv`` isolated, its cgroups made; raises
    ``SandboxUnavailable`` when it cannot be. ``release()`` it after."""
    check_available()
    prepare_workspace(workspace)
    # All of it, not only up to the quota: the watch lets a workspace already
    # over it shrink, not grow.
    used = workspace_usage(workspace)
    # No single file may grow past what is left of the quota; over it, the
    # call can still read and delete, not grow anything.
    file_bytes = max(0, min(limits.file_bytes, limits.workspace_bytes - used))
    cpu_seconds = max(1, cpu_seconds)
    if sandbox_mode() == "none":
        command = plain_argv(argv, limits=limits, cpu_seconds=cpu_seconds, file_bytes=file_bytes)
        return Prepared(command=command, pass_fds=(), cgroup=None, used=used)
    cgroup = None
    prefix: list[str] = []
    root = cgroup_root()
    if root is not None:
        cgroup = CallCgroup(root=root, limits=limits)
        procs = cgroup.create()
        prefix = ["/bin/sh", "-c", _JOIN_CGROUPS, "studio-sandbox", *map(str, procs), "--"]
    filter_fd = seccomp_fd()
    command = bwrap_argv(
        argv,
        workspace=workspace,
        limits=limits,
        cpu_seconds=cpu_seconds,
        file_bytes=file_bytes,
        ids=sandbox_ids(workspace),
        memory_rlimit=cgroup is None,
        seccomp=filter_fd,
    )
    return Prepared(
        command=[*prefix, *command],
        pass_fds=() if filter_fd is None else (filter_fd,),
        cgroup=cgroup,
        used=used,
    )


def run_tool(argv: list[str], *, workspace: Path, **kwargs) -> ToolResult:
    """Run ``argv`` in the sandbox as a tool call: its result, with the images it made."""
    workspace.mkdir(parents=True, exist_ok=True)
    before = snapshot(workspace)
    try:
        ran = run_sandboxed(argv, workspace=workspace, **kwargs)
    except SandboxUnavailable as exc:
        return ToolResult(str(exc), ok=False)
    return tool_result(ran, workspace=workspace, before=before, timeout=kwargs["timeout"])


def tool_result(ran: SandboxResult, *, workspace: Path, before: dict, timeout: float) -> ToolResult:
    """What a call gave back, with the images it made (since ``before``, a
    ``snapshot``) and, for a cut output, the workspace file holding all of it."""
    result = ran.as_result(timeout=timeout)
    made = keep(workspace, produced(workspace, before))
    files = tuple(image.as_dict() for image in made)
    text = result.text + notice_for(made)
    if ran.whole is not None:
        with ran.whole:
            kept = keep_whole_output(workspace, ran.whole)
        if kept is not None:
            files += (kept,)
            text += f"\n[The whole output is in the workspace as {kept['name']}.]"
    return ToolResult(text, ok=result.ok, images=files, stopped=result.stopped)


def keep_whole_output(workspace: Path, whole: IO[bytes]) -> dict | None:
    """Save a cut output whole as a workspace file (the tools' uid owns it), so the
    member can download it and the model can read it; None if it does not fit."""
    size = whole.tell()
    quota_left = settings.STUDIO_WORKSPACE_QUOTA_MB * MB - workspace_usage(workspace)
    if size > quota_left:
        return None
    name = f"{WHOLE_OUTPUT_DIR}/{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.txt"
    whole.seek(0)
    try:
        write_beneath(workspace, name, iter(lambda: whole.read(1 << 16), b""))
    except OSError:
        logger.warning("could not keep a tool's whole output in %s", workspace, exc_info=True)
        return None
    return {"name": name, "size": size, "mime": "text/plain", "shown": False, "output": True}


def write_beneath(root: Path, name: str, chunks) -> None:
    """Write ``chunks`` as ``name`` under ``root`` (folders made as needed),
    never through a symlink, replacing what had that name; owned by the
    uid the root's tools run as."""
    parts = PurePosixPath(name).parts
    if not parts or PurePosixPath(name).is_absolute() or any(p in (".", "..") for p in parts):
        raise OSError(f"not a name under the workspace: {name}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_DIRECTORY
    ids = sandbox_ids(root)
    fds = [os.open(root, flags)]
    try:
        for folder in parts[:-1]:
            try:
                os.mkdir(folder, 0o700, dir_fd=fds[-1])
                if ids is not None:
                    os.chown(folder, *ids, dir_fd=fds[-1], follow_symlinks=False)
            except FileExistsError:
                pass
            fds.append(os.open(folder, flags, dir_fd=fds[-1]))
        folder = fds[-1]
        temporary = f".studio-{secrets.token_hex(8)}"
        fd = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=folder,
        )
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                for chunk in chunks:
                    out.write(chunk)
            if ids is not None:
                os.fchown(fd, *ids)
            os.close(fd)
            # rename replaces a symlink of that name itself, never its target.
            os.replace(temporary, parts[-1], src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        for fd in reversed(fds):
            os.close(fd)


def _run(
    command: list[str],
    *,
    workspace: Path,
    timeout: float,
    cancel: CancelToken | None,
    stdin: str | None,
    limits: Limits,
    cgroup: CallCgroup | None,
    used: int,
    pass_fds: tuple[int, ...] = (),
    progress: Progress | None = None,
) -> SandboxResult:
    proc = subprocess.Popen(  # noqa: S603 - argv is built here, never a shell string
        command,
        cwd=workspace,
        env=clean_env(workspace),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        close_fds=True,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    sink = OutputSink()

    def drain() -> None:
        assert proc.stdout is not None
        while block := proc.stdout.read1(65536):
            sink.add(block)

    reader = threading.Thread(target=drain, daemon=True, name="studio-tool-output")
    reader.start()
    if stdin is not None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    quota = QuotaWatch(workspace, limits.workspace_bytes, used=used)
    live = LiveOutput(sink, progress) if progress is not None else None
    timed_out, cancelled, over_quota = watch(
        proc, timeout=timeout, cancel=cancel, quota=quota, tick=live
    )
    # bubblewrap's PID namespace dies with its init: killing the session
    # takes every process the program started, whatever it did to detach.
    kill_session(proc)
    if cgroup is not None:
        cgroup.kill_all()
    reader.join(5)
    return SandboxResult(
        output=sink.text(),
        exit_code=proc.returncode,
        timed_out=timed_out,
        cancelled=cancelled,
        truncated_bytes=sink.dropped,
        whole=sink.whole,
        out_of_memory=cgroup is not None and cgroup.out_of_memory(),
        over_quota=over_quota,
        quota_bytes=limits.workspace_bytes,
    )


def watch(
    proc: subprocess.Popen,
    *,
    timeout: float,
    cancel: CancelToken | None,
    quota: QuotaWatch,
    ended: threading.Event | None = None,
    tick: Callable[[float], None] | None = None,
) -> tuple[bool, bool, bool]:
    """Until the process exits (or ``ended`` is set): (timed out, cancelled, over its
    quota). ``tick`` is called with the time between its looks (the live output)."""
    deadline = time.monotonic() + timeout
    while True:
        step = max(0.005, min(0.05, quota.next_check - time.monotonic()))
        if ended is None:
            try:
                proc.wait(timeout=step)
                break
            except subprocess.TimeoutExpired:
                pass
        elif ended.wait(step) or proc.poll() is not None:
            break
        now = time.monotonic()
        if tick is not None:
            tick(now)
        if cancel is not None and cancel.is_set():
            return False, True, False
        if now >= deadline:
            return True, False, False
        if now >= quota.next_check and quota.check(now):
            return False, False, True
    return False, False, False


class OutputSink:
    """A call's output: its first OUTPUT_CAP bytes for the chat and the model,
    and, once it passes that, the whole (up to WHOLE_OUTPUT_CAP) in a file."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0
        self.whole: IO[bytes] | None = None
        self.latest = bytearray()  # its last LIVE_BYTES, past the cap too

    def add(self, block: bytes) -> None:
        self.latest += block[-LIVE_BYTES:]
        del self.latest[:-LIVE_BYTES]
        room = OUTPUT_CAP - self.kept
        if room > 0:
            self.chunks.append(block[:room])
            self.kept += min(room, len(block))
        self.dropped += max(0, len(block) - max(room, 0))
        if self.dropped:
            if self.whole is None:
                self.whole = tempfile.TemporaryFile()
                self.whole.write(b"".join(self.chunks))
                block = block[max(room, 0) :]
            if self.whole.tell() < WHOLE_OUTPUT_CAP:
                self.whole.write(block[: WHOLE_OUTPUT_CAP - self.whole.tell()])

    def text(self) -> str:
        return strip_nul(b"".join(self.chunks).decode("utf-8", errors="replace"))


class LiveOutput:
    """Hands a running call's latest output to ``progress`` when it grew, at most
    every LIVE_SECONDS (the first after LIVE_SECONDS: a quick call shows only
    its result). Called from the thread that watches the call."""

    def __init__(self, sink: OutputSink, progress: Progress) -> None:
        self.sink, self.progress = sink, progress
        self.shown = 0
        self.at = time.monotonic()

    def __call__(self, now: float) -> None:
        seen = self.sink.kept + self.sink.dropped
        if seen == self.shown or now - self.at < LIVE_SECONDS:
            return
        self.shown, self.at = seen, now
        latest = bytes(self.sink.latest)  # one copy: the reader thread appends meanwhile
        text = strip_nul(latest.decode("utf-8", errors="replace"))
        if seen > len(latest):
            text = "…" + text.lstrip("\ufffd")  # the start of a character may be cut
        try:
            self.progress(text)
        except Exception:  # the card missing a frame must not stop the call
            logger.warning("live output of a call was not sent", exc_info=True)


class QuotaWatch:
    """When to look at a running call's workspace, and whether it passed its quota."""

    def __init__(self, workspace: Path, quota: int, *, used: int) -> None:
        self.workspace = workspace
        self.used = used
        # A workspace already over it (by the last call's slack) may shrink, not grow.
        self.quota = max(quota, self.used)
        self.rate = QUOTA_RATE
        self.checked_at = time.monotonic()
        self.next_check = self.checked_at + self._interval()

    def check(self, now: float) -> bool:
        used = workspace_usage(self.workspace, stop_above=self.quota)
        if now > self.checked_at:
            self.rate = max(self.rate, (used - self.used) / (now - self.checked_at))
        self.used, self.checked_at = used, now
        self.next_check = now + self._interval()
        return used > self.quota

    def _interval(self) -> float:
        # A third of the time the fastest writer needs to pass the quota by the slack.
        headroom = max(0, self.quota + QUOTA_SLACK - self.used)
        low, high = _QUOTA_CHECK_SECONDS
        return min(high, max(low, headroom / self.rate / 3))


def kill_session(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)

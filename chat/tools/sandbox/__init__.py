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

from chat.tools.sandbox.cgroups import CallCgroup
from chat.tools.sandbox.command import (
    GIT_PINNED,
    MPL_DIR,
    NAMESPACES,
    PRIVATE_DIRS,
    bwrap_argv,
    clean_env,
    drop_to,
    font_caches,
    plain_argv,
    system_view,
    under_private_dir,
)
from chat.tools.sandbox.files import (
    SANDBOX_UID_BASE,
    prepare_workspace,
    sandbox_ids,
    walk_beneath,
    workspace_usage,
    write_beneath,
)
from chat.tools.sandbox.host import (
    INSTALL_HINT,
    CgroupRoot,
    SandboxUnavailable,
    bwrap_path,
    can_drop_privileges,
    cgroup_root,
    check_available,
    describe,
    sandbox_mode,
    sandbox_python,
)
from chat.tools.sandbox.limits import MB, Limits, default_limits
from chat.tools.sandbox.process import (
    LIVE_BYTES,
    LIVE_SECONDS,
    OUTPUT_CAP,
    QUOTA_RATE,
    QUOTA_SLACK,
    WHOLE_OUTPUT_CAP,
    LiveOutput,
    OutputSink,
    QuotaWatch,
    kill_session,
    watch,
)
from chat.tools.sandbox.result import (
    NO_NETWORK_NOTE,
    WHOLE_OUTPUT_DIR,
    SandboxResult,
    keep_whole_output,
    tool_result,
)
from chat.tools.sandbox.run import Prepared, prepare, run_sandboxed, run_tool
from chat.tools.sandbox.seccomp import seccomp_fd, seccomp_program

__all__ = [
    "CallCgroup",
    "CgroupRoot",
    "GIT_PINNED",
    "INSTALL_HINT",
    "LIVE_BYTES",
    "LIVE_SECONDS",
    "Limits",
    "LiveOutput",
    "MB",
    "MPL_DIR",
    "NAMESPACES",
    "NO_NETWORK_NOTE",
    "OUTPUT_CAP",
    "OutputSink",
    "PRIVATE_DIRS",
    "Prepared",
    "QUOTA_RATE",
    "QUOTA_SLACK",
    "QuotaWatch",
    "SANDBOX_UID_BASE",
    "SandboxResult",
    "SandboxUnavailable",
    "WHOLE_OUTPUT_CAP",
    "WHOLE_OUTPUT_DIR",
    "bwrap_argv",
    "bwrap_path",
    "can_drop_privileges",
    "cgroup_root",
    "check_available",
    "clean_env",
    "default_limits",
    "describe",
    "drop_to",
    "font_caches",
    "keep_whole_output",
    "kill_session",
    "plain_argv",
    "prepare",
    "prepare_workspace",
    "run_sandboxed",
    "run_tool",
    "sandbox_ids",
    "sandbox_mode",
    "sandbox_python",
    "seccomp_fd",
    "seccomp_program",
    "system_view",
    "tool_result",
    "under_private_dir",
    "walk_beneath",
    "watch",
    "workspace_usage",
    "write_beneath",
]

"""A memory and a pids cgroup made for one call, below the subtree the host gives."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from chat.tools.sandbox.host import CgroupRoot
from chat.tools.sandbox.limits import Limits


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
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'

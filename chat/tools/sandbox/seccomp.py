"""The seccomp filter every call runs under (no fallocate, no io_uring)."""

from __future__ import annotations

import os
import struct
from functools import cache

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

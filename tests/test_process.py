"""A process's identity: a process of the same host can tell that it exited."""

from __future__ import annotations

import subprocess
import sys

from studio import process

CHILD = (
    "import sys; from studio.process import identity; "
    "print(identity(), flush=True); sys.stdin.read()"
)


def test_a_process_of_this_host_is_gone_once_it_exits():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        named = child.stdout.readline().strip()
        assert named and named != process.identity()
        assert not process.gone(named)
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert process.gone(named)


def test_a_reused_pid_is_not_the_process_that_had_it():
    boot, namespace, pid, started = process.identity().split("/")
    assert process.gone(f"{boot}/{namespace}/{pid}/{int(started) + 1}")
    assert not process.gone(process.identity())


def test_a_process_elsewhere_is_never_called_gone():
    boot, namespace, pid, started = process.identity().split("/")
    assert not process.gone(f"another-boot/{namespace}/999999/1")
    assert not process.gone(f"{boot}/another-namespace/999999/1")
    assert not process.gone("")
    assert not process.gone("not an identity")
    assert not process.gone(f"{boot}/{namespace}/{pid}")  # no start time: cannot tell


def test_a_forked_child_is_named_for_itself():
    import os

    parent = process.identity()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(reader)
        os.write(writer, process.identity().encode())
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        named = pipe.read()
    os.waitpid(child, 0)
    assert named and named != parent and named.split("/")[2] == str(child)
    assert process.gone(named)

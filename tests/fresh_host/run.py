"""From a bare Debian 12 to a gated call through nginx, by the README's words.

``make fresh-host`` (CI runs it after the suite, as root): debootstrap a
Debian 12 (bookworm) with systemd, copy this checkout to ``/srv/studio``,
and run the README's Production block there, unedited:

1. with the network, fetch the Debian packages and wheels the block
   installs (into apt's cache and a local pip index), installing nothing;
2. booted under ``systemd-nspawn`` with a network of its own (loopback
   only: this machine's PostgreSQL and Redis hold the ports the host's own
   use), the whole block from its first line, with real systemd.

Two commands cannot do here what they do on the internet and are stood in
for: ``certbot`` (no Let's Encrypt: the stand-in makes a self-signed
certificate where certbot puts its own, running the same hooks), and
``studio.example.com`` resolves to the host itself. ``createsuperuser`` is
answered at its prompts. Then ``gated_call`` drives a call through nginx,
and the checks below read what runs as whom. Exits non-zero on any step
that fails, with the units' journal.
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("STUDIO_FRESH_HOST_DIR", "/var/tmp/studio-fresh-host"))
MIRROR = "http://deb.debian.org/debian"
ADMIN, PASSWORD = "admin", "fresh-host-Pa55word-7291"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
UNITS = ("studio@8001", "studio@8002", "studio@8003", "studio-cgroups", "nginx", "prometheus")

# Let's Encrypt is out of reach: the same files, self-signed, and the hooks run.
CERTBOT = """#!/usr/bin/python3
import argparse, datetime, os, subprocess
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
parser = argparse.ArgumentParser()
parser.add_argument("verb")
parser.add_argument("--standalone", action="store_true")
parser.add_argument("-d", dest="domain", required=True)
parser.add_argument("--pre-hook")
parser.add_argument("--post-hook")
args = parser.parse_args()
if args.pre_hook:
    subprocess.run(args.pre_hook, shell=True, check=True)
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, args.domain)])
now = datetime.datetime.now(datetime.timezone.utc)
certificate = (
    x509.CertificateBuilder().subject_name(name).issuer_name(name)
    .public_key(key.public_key()).serial_number(x509.random_serial_number())
    .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=90))
    .add_extension(x509.SubjectAlternativeName([x509.DNSName(args.domain)]), critical=False)
    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    .sign(key, hashes.SHA256())
)
live = f"/etc/letsencrypt/live/{args.domain}"
os.makedirs(live, mode=0o700, exist_ok=True)
with open(f"{live}/privkey.pem", "wb") as out:
    out.write(key.private_bytes(serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
with open(f"{live}/fullchain.pem", "wb") as out:
    out.write(certificate.public_bytes(serialization.Encoding.PEM))
if args.post_hook:
    subprocess.run(args.post_hook, shell=True, check=True)
"""


CGROUPS_WRITABLE = """for controller in memory pids; do
  umount /sys/fs/cgroup/$controller
  mount -t cgroup -o $controller cgroup /sys/fs/cgroup/$controller
done"""


def say(text: str) -> None:
    print(f"== fresh host: {text}", flush=True)


def production_block() -> str:
    """The README's Production commands, exactly as a reader copies them."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("From a fresh Debian host, as root, in `/srv/studio`")
    return readme[start:].split("```sh\n", 1)[1].split("```", 1)[0]


def commands(block: str) -> list[str]:
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def bootstrap() -> Path:
    base = WORK / "bookworm"
    if not (base / ".complete").exists():
        say(f"debootstrap bookworm into {base}")
        shutil.rmtree(base, ignore_errors=True)
        base.parent.mkdir(parents=True, exist_ok=True)
        include = "systemd,systemd-sysv,dbus,ca-certificates"
        run(["debootstrap", "--variant=minbase", f"--include={include}", "bookworm", base, MIRROR])
        # What Debian's installer writes and debootstrap does not.
        (base / "etc/hostname").write_text("studio\n")
        (base / "etc/hosts").write_text(
            "127.0.0.1\tlocalhost\n127.0.1.1\tstudio\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        )
        (base / ".complete").touch()
    root = WORK / "host"
    if root.exists():
        run(["rm", "-rf", "--one-file-system", root])
    run(["cp", "-a", base, root])
    (root / ".complete").unlink()
    return root


def copy_checkout(root: Path) -> None:
    """The tracked files, as a clone holds them (no virtualenv, no caches)."""
    target = root / "srv/studio"
    target.mkdir(parents=True)
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout  # fmt: skip
    present = b"\0".join(f for f in files.split(b"\0") if f and (REPO / os.fsdecode(f)).exists())
    subprocess.run(["tar", "-C", REPO, "--null", "-T", "-", "-cf", "-"], input=present,
                   stdout=open(target / ".copy.tar", "wb"), check=True)  # fmt: skip
    run(["tar", "-C", target, "-xf", target / ".copy.tar"])
    (target / ".copy.tar").unlink()


WHEELS = "/var/cache/studio-wheels"


def run(argv: list, **kwargs) -> None:
    subprocess.run([str(a) for a in argv], check=True, **kwargs)


def download_phase(root: Path, block: str) -> None:
    """Phase 1, with the network: fetch what the block installs, install nothing.

    The debs go to apt's cache and the wheels to a folder that the host's
    ``/etc/pip.conf`` names as its index, so phase 2 runs the block's
    ``apt-get`` and ``make`` lines as written, offline. (Installing here would
    start nothing, but PostgreSQL's cluster would take port 5433: this
    machine's own server holds 5432.)
    """
    installs = [c for c in commands(block) if c.startswith("apt-get install")]
    packages = sorted({p for c in installs for p in c.split("#")[0].split()[2:] if p != "-y"})
    say("phase 1: download " + " ".join(packages))
    anchors = Path("/usr/local/share/ca-certificates")  # this machine's egress CA
    if anchors.is_dir():
        shutil.copytree(anchors, root / anchors.relative_to("/"), dirs_exist_ok=True)
    # The wheels are picked by the host's own Python (3.11.2 needs a backport
    # that this machine's 3.11.7 does not): a throwaway virtualenv fetches them.
    script = f"""set -eux
update-ca-certificates >/dev/null
apt-get update -qq
apt-get install -y -qq --download-only {" ".join(packages)}
apt-get install -y -qq python3-venv >/dev/null
python3 -m venv /var/tmp/fetch
/var/tmp/fetch/bin/pip download -q -d {WHEELS} pip -r /srv/studio/requirements.txt
rm -r /var/tmp/fetch
"""
    run(
        ["systemd-nspawn", "-q", "-D", root, "--register=no", "--keep-unit", "--pipe",
         "--setenv=DEBIAN_FRONTEND=noninteractive", f"--setenv=PATH={PATH}",
         "/bin/bash", "-c", script],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    (root / "etc/pip.conf").write_text(f"[global]\nno-index = true\nfind-links = {WHEELS}\n")


def init_pid(nspawn: subprocess.Popen) -> int:
    """The booted host's systemd: the process under nspawn that runs it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pending = [nspawn.pid]
        while pending:
            pid = pending.pop()
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            if comm == "systemd" and pid != nspawn.pid:
                return pid
            pending += [int(c) for c in children]
        if nspawn.poll() is not None:
            sys.exit(f"fresh host: systemd-nspawn exited with {nspawn.returncode}")
        time.sleep(0.2)
    sys.exit("fresh host: the booted host's systemd did not appear within 60 s")


def inside(pid: int, command: str) -> list[str]:
    environment = ["env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8", "TERM=dumb"]
    return ["nsenter", "-t", str(pid), "-a", *environment, "/bin/bash", "-c", command]


def answer_prompts(argv: list[str], timeout: float) -> int:
    """Run ``argv`` on a terminal, answering createsuperuser as an operator would."""
    answers = [
        (rb"Username[^:]*: $", ADMIN),
        (rb"Email address: $", "admin@example.com"),
        (rb"Password \(again\): $", PASSWORD),
        (rb"Password: $", PASSWORD),
    ]
    child, terminal = pty.fork()
    if child == 0:
        os.execvp(argv[0], argv)  # noqa: S606 (our own nsenter line)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([terminal], [], [], 1)
        if ready:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:
                break  # the terminal closes when the block ends
            if not chunk:
                break
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            seen = (seen + chunk)[-512:]
            for prompt, reply in answers:
                if re.search(prompt, seen):
                    os.write(terminal, reply.encode() + b"\n")
                    seen = b""
                    break
    else:
        os.kill(child, 9)
        sys.exit(f"fresh host: the Production block did not finish within {timeout:.0f} s")
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def boot_phase(root: Path, block: str) -> None:
    """Phase 2: boot the host, loopback only, and run the whole block there."""
    (root / "usr/local/sbin/certbot").write_text(CERTBOT)
    (root / "usr/local/sbin/certbot").chmod(0o755)
    with open(root / "etc/hosts", "a") as hosts:
        hosts.write("127.0.0.1 studio.example.com\n")
    (root / "root/production.sh").write_text(block)
    log = open(WORK / "boot.log", "wb")
    nspawn = subprocess.Popen(
        ["systemd-nspawn", "-q", "-D", root, "--register=no", "--keep-unit",
         "--private-network", "--boot", "--console=pipe"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    pid = None
    try:
        pid = init_pid(nspawn)
        subprocess.run(inside(pid, "systemctl is-system-running --wait"), timeout=120)
        # nspawn mounts a booted host's cgroup v1 controllers read-only; a
        # real host's root may write them (studio-cgroups.service does).
        run(inside(pid, CGROUPS_WRITABLE))
        say("phase 2: the README's Production block, booted, loopback only")
        status = answer_prompts(
            inside(pid, "cd /srv/studio && exec bash -eux /root/production.sh"), timeout=900
        )
        if status != 0:
            sys.exit(f"fresh host: the Production block failed ({status})")
        verify(root, pid)
    except BaseException:
        if pid is not None:
            subprocess.run(inside(pid, "journalctl --no-pager -n 200 -u 'studio*' -u nginx"))
        raise
    finally:
        nspawn.terminate()
        try:
            nspawn.wait(60)
        except subprocess.TimeoutExpired:
            nspawn.kill()
            nspawn.wait(10)


def verify(root: Path, pid: int) -> None:
    say("what runs, as whom")
    run(inside(pid, "systemctl is-active " + " ".join(UNITS)))
    listed = subprocess.run(
        inside(pid, "ps -C daphne -o user= | sort -u"), capture_output=True, text=True, check=True
    )
    users = set(listed.stdout.split())
    if users != {"studio"}:
        sys.exit(f"fresh host: daphne runs as {sorted(users) or 'nobody at all'}, not studio")
    mode = (root / "etc/studio/studio.env").stat().st_mode & 0o777
    if mode != 0o600:
        sys.exit(f"fresh host: /etc/studio/studio.env is {mode:o}, not 600")
    say("a gated call through nginx")
    run(
        inside(
            pid,
            f"cd /srv/studio && .venv/bin/python -m tests.fresh_host.gated_call {ADMIN} {PASSWORD}",
        )
    )


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("fresh host: run as root (debootstrap and systemd-nspawn need it)")
    started = time.monotonic()
    block = production_block()
    root = bootstrap()
    copy_checkout(root)
    download_phase(root, block)
    boot_phase(root, block)
    run(["rm", "-rf", "--one-file-system", root])  # kept when a step fails, to look into
    say(f"passed in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

"""The shipped systemd units, read by systemd's own verifier and for their ordering."""

from __future__ import annotations

import configparser
import shutil
import subprocess

import pytest

from tests.helpers.procs import ROOT

UNITS = ROOT / "deploy" / "systemd"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((UNITS / name).read_text())
    return parser


def words(parser: configparser.ConfigParser, section: str, key: str) -> set[str]:
    return set(parser.get(section, key, fallback="").split())


def test_each_process_starts_after_its_metrics_directory_exists():
    """Issue 53: ``Before=studio@.service`` (the bare template) ordered no instance,
    so a process could start before the directory and crash."""
    instance = unit("studio@.service")
    assert "studio-metrics-dir.service" in words(instance, "Unit", "Requires")
    assert "studio-metrics-dir.service" in words(instance, "Unit", "After")
    assert "studio@.service" not in words(unit("studio-metrics-dir.service"), "Unit", "Before")


def test_systemd_reads_the_units_without_complaint(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing (Debian's systemd package)")
    for path in UNITS.iterdir():
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(UNITS / "studio@.service", tmp_path / "studio@8001.service")
    names = [p.name for p in tmp_path.iterdir() if p.name != "studio@.service"]
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # The one complaint a build machine may make: /srv/studio is not installed here.
    complaints = [
        line for line in done.stderr.splitlines() if line.strip() and "/srv/studio/" not in line
    ]
    assert complaints == []


@pytest.mark.parametrize("name", ["studio@.service", "studio-purge.service"])
def test_studio_itself_never_runs_as_root(name):
    """Issue 53: the web processes ran as root, for the sandbox's sake. Only the
    cgroup helper and the metrics folder's oneshot are root, and say why."""
    service = unit(name)
    assert service.get("Service", "User") == "studio"
    assert service.get("Service", "NoNewPrivileges") == "yes"
    assert "Delegate" not in service["Service"]


def test_only_the_small_helpers_are_privileged():
    rooted = {
        path.name
        for path in UNITS.glob("*.service")
        if unit(path.name).get("Service", "User", fallback="root") == "root"
    }
    assert rooted == {"studio-cgroups.service", "studio-metrics-dir.service"}

"""The systemd units in ``systemd/``: ``systemd-analyze verify`` accepts them,
and they say what the daemons rely on (docs/operations.md, "systemd")."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
#: Where the units expect the installed package; the tests use this venv's.
INSTALLED = "/opt/minibatch/bin/"
SERVICES = [
    "minibatch-server.service",
    "minibatch-scheduler.service",
    "minibatch-node@.service",
]


def settings(name: str) -> dict[str, list[str]]:
    """``Section.Key`` -> every value given, in order (keys may repeat)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def test_systemd_analyze_verify_accepts_every_unit(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: install Debian's systemd (.ci/run)"
    bin_dir = f"{Path(sys.executable).parent}/"
    for unit in UNITS.iterdir():
        text = unit.read_text()
        if unit.suffix == ".service":
            assert INSTALLED in text, f"{unit.name} runs something else"
        # verify checks that ExecStart exists: point it at this checkout's venv.
        (tmp_path / unit.name).write_text(text.replace(INSTALLED, bin_dir))
    names = [u.name.replace("@.", "@node0.") for u in sorted(UNITS.iterdir())]
    proc = subprocess.run(
        [analyze, "verify", "--man=no", *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Unknown keys and bad values are only warnings, with exit status 0.
    ours = [line for line in proc.stderr.splitlines() if "minibatch" in line]
    assert proc.returncode == 0 and not ours, proc.stderr


@pytest.mark.parametrize("name", SERVICES)
def test_every_daemon_says_when_it_is_ready(name: str):
    unit = settings(name)
    assert unit["Service.Type"] == ["notify"]
    assert unit["Service.LimitNOFILE"] == ["65536"]
    assert unit["Service.StateDirectory"] == ["minibatch"]
    # Users reach the socket, the config and their jobs' spool files inside.
    assert unit["Service.StateDirectoryMode"] == ["0711"]


def test_the_node_unit_can_still_launch_jobs():
    node = settings("minibatch-node@.service")
    assert node["Service.KillMode"] == ["mixed"]
    assert node["Service.Delegate"] == ["yes"]
    # The daemon changes to each job's user, and jobs run inside the unit.
    for key in ("NoNewPrivileges", "ProtectSystem", "CapabilityBoundingSet"):
        assert f"Service.{key}" not in node, key


def test_server_and_scheduler_are_sandboxed():
    for name in SERVICES[:2]:
        unit = settings(name)
        assert unit["Service.PrivateTmp"] == ["yes"], name
        assert unit["Service.ProtectKernelTunables"] == ["yes"], name
        assert unit["Service.RestrictSUIDSGID"] == ["yes"], name

"""Debian's mosquitto as the cluster's broker (``[mqtt] broker = "mosquitto"``).

``mb-broker --mosquitto`` writes mosquitto's files beside the credentials file
(``run/``) and runs it as a child until SIGTERM, so ``mb up``, ``mb down`` and
``mb status`` treat it as they treat the embedded broker. The rules are the
embedded broker's (:mod:`minibatch.events.brokerauth`): one listener on a
loopback address, anyone may subscribe, only the server (its password, hashed
as ``mosquitto_passwd`` does) may publish. Mosquitto checks a client's will
against the ACL when it connects, so no will can forge an event either.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from minibatch.events.credentials import Credentials

#: Where Debian installs it (/usr/sbin is not on every user's PATH).
DEBIAN_PATH = "/usr/sbin/mosquitto"
#: What ``mosquitto_passwd`` uses: PBKDF2-HMAC-SHA512, 101 rounds, 12-byte salt.
ROUNDS, SALT_BYTES = 101, 12
_PR_SET_PDEATHSIG = 1


def executable() -> str | None:
    """The mosquitto program, or None where it is not installed."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return DEBIAN_PATH if os.access(DEBIAN_PATH, os.X_OK) else None


def password_line(cred: Credentials, salt: bytes | None = None) -> str:
    """``cred`` as a line of mosquitto's password file (``$7$`` hash)."""
    salt = salt if salt is not None else os.urandom(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", cred.password.encode(), salt, ROUNDS)
    b64 = base64.b64encode
    return f"{cred.user}:$7${ROUNDS}${b64(salt).decode()}${b64(digest).decode()}\n"


def acl_text(cred: Credentials) -> str:
    # Lines before the first ``user`` are anonymous clients' (everyone's).
    return f"topic read #\n\nuser {cred.user}\ntopic readwrite #\n"


def write_config(where: Path, host: str, port: int, cred: Credentials) -> Path:
    """Write mosquitto's config, password and ACL files in ``where``; the config."""
    passwd, acl, conf = (where / f"mosquitto.{x}" for x in ("passwd", "acl", "conf"))
    for path, text in ((passwd, password_line(cred)), (acl, acl_text(cred))):
        _write_private(path, text)
    _write_private(
        conf,
        f"listener {port} {host}\n"
        "allow_anonymous true\n"
        f"password_file {passwd}\n"
        f"acl_file {acl}\n"
        "persistence false\n"
        "log_dest stderr\n"
        "log_type error\nlog_type warning\nlog_type notice\n"
        # Run as root, mosquitto would switch to a user "mosquitto" that cannot
        # read these files; it stays the daemons' user instead.
        f"user {pwd.getpwuid(os.geteuid()).pw_name}\n",
    )
    return conf


def _write_private(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGKILL of mb-broker must not leave
    # mosquitto holding the port.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def run(program: str, conf: Path) -> int:
    """Run mosquitto with ``conf`` until it exits, passing SIGTERM and SIGINT
    on; its exit status."""
    proc = subprocess.Popen(
        [program, "-c", str(conf)], preexec_fn=_die_with_parent, close_fds=True
    )

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    return proc.wait()

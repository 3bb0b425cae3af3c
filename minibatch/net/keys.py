"""CURVE keys on disk: the server's keypair, the client keys it accepts, and a
client's own keypair with the server's public key.

Keys are pyzmq's: made by :func:`zmq.auth.create_certificates` and read by
:func:`zmq.auth.load_certificate` (Z85 text, 40 characters). Nothing here does
cryptography; it keeps files in their places with their modes:

* the server's, in ``$MB_HOME/state/keys/`` (0700): ``server.key``,
  ``server.key_secret`` (0600) and ``authorized``, one registered key a line
  (``user alice KEY``, ``node node3 KEY``), like ssh's ``authorized_keys``;
* a client's, in ``$MB_HOME/keys/`` (0700): ``client.key``,
  ``client.key_secret`` (0600) and ``server.key``, the server it trusts.

Root may run ``mb keys`` for a cluster owned by someone else: what it writes
in ``state/keys`` is then given to the owner of ``state/``, or the server
(which runs as the owner) could not read it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth
from zmq.utils import z85

from minibatch.errors import InvalidArgument, MinibatchError

SERVER = "server"
CLIENT = "client"
AUTHORIZED = "authorized"
KINDS = ("user", "node")
#: How long a lookup may trust its copy of ``authorized`` before it looks at
#: the file again (the server's per-request check of a tcp caller's key).
RECHECK_S = 1.0
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


def require_curve() -> None:
    """Raise, saying what to do, when this libzmq was built without CURVE."""
    if not zmq.has("curve"):
        raise MinibatchError(
            f"this libzmq ({zmq.zmq_version()}) has no CURVE security, which tcp "
            "connections need: install pyzmq's own wheel (it bundles libzmq with "
            "CURVE) or a libzmq built with libsodium"
        )


def check_key(text: str) -> str:
    """``text`` if it is a Z85 public key (40 characters, 32 bytes)."""
    key = text.strip()
    try:
        ok = len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError, struct.error):  # not Z85, or out of range
        ok = False
    if not ok:
        raise InvalidArgument(
            f"{text!r} is not a CURVE public key (40 characters of Z85, as "
            "`mb keys show` prints them)"
        )
    return key


def _private_dir(path: Path, owner: Path | None = None) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    if owner is not None:
        _own_like(path, owner)


def _own_like(path: Path, ref: Path) -> None:
    """Give ``path`` to the owner of ``ref`` when root writes it."""
    if os.geteuid() == 0:
        st = ref.stat()
        os.chown(path, st.st_uid, st.st_gid)


def _write(path: Path, text: str, mode: int, owner: Path | None = None) -> None:
    """Replace ``path`` atomically, with ``mode`` from the start."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if owner is not None:
            _own_like(tmp, owner)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _keypair(folder: Path, name: str, owner: Path | None = None) -> tuple[str, bool]:
    """The public key of ``folder/name.key``, made first if there is none;
    and whether it was made now."""
    public = folder / f"{name}.key"
    secret = folder / f"{name}.key_secret"
    if secret.exists():
        return read_keypair(folder, name)[0], False
    require_curve()
    _private_dir(folder, owner)
    # The folder is 0700 before the files exist, so the secret is never
    # readable by others, even before its own mode is set.
    zmq.auth.create_certificates(folder, name)
    secret.chmod(0o600)
    if owner is not None:
        _own_like(public, owner)
        _own_like(secret, owner)
    return read_keypair(folder, name)[0], True


def read_keypair(folder: Path, name: str) -> tuple[str, str]:
    """Public and secret key of ``folder/name.key_secret``."""
    path = folder / f"{name}.key_secret"
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise MinibatchError(f"cannot read the CURVE key {path}: {exc}") from None
    if secret is None:
        raise MinibatchError(f"{path} holds no secret key")
    return public.decode(), secret.decode()


def server_keypair(keys: Path) -> tuple[str, bool]:
    """The server's public key (made if missing) and whether it was made now.
    ``keys`` is ``Paths.server_keys``; its parent ``state/`` names the owner."""
    return _keypair(keys, SERVER, owner=keys.parent)


def client_keypair(keys: Path) -> tuple[str, bool]:
    """This client's public key (made if missing), and whether it was made now."""
    return _keypair(keys, CLIENT)


def trust(keys: Path, server_public: str) -> None:
    """Make ``server_public`` the server this client talks to."""
    key = check_key(server_public)
    _private_dir(keys)
    # pyzmq's certificate format, public part only (load_certificate reads it).
    text = f'metadata\ncurve\n    public-key = "{key}"\n'
    _write(keys / f"{SERVER}.key", text, 0o644)


@dataclass(frozen=True)
class ClientKeys:
    """What a tcp client needs: its own keypair and the server's public key."""

    public: str
    secret: str
    server: str


def load_client(keys: Path) -> ClientKeys:
    """This client's keys, or an error saying which command makes them."""
    require_curve()
    if not (keys / f"{CLIENT}.key_secret").exists():
        raise MinibatchError(
            f"no client key in {keys}: make one with `mb keys init --client` and "
            "have the server's operator register it"
        )
    if not (keys / f"{SERVER}.key").exists():
        raise MinibatchError(
            f"no server key in {keys}: ask the server's operator for it (`mb keys "
            "show` on the server) and run `mb keys trust KEY`"
        )
    public, secret = read_keypair(keys, CLIENT)
    try:
        server, _ = zmq.auth.load_certificate(keys / f"{SERVER}.key")
    except (OSError, ValueError) as exc:
        raise MinibatchError(f"cannot read {keys / SERVER}.key: {exc}") from None
    return ClientKeys(public, secret, server.decode())


class Entry(NamedTuple):
    """A registered client key: a user's (``user``) or a node daemon's (``node``)."""

    kind: str
    name: str
    key: str

    def line(self) -> str:
        return f"{self.kind} {self.name} {self.key}"


def check_entry(kind: str, name: str) -> None:
    """Refuse a name no key may stand for: an unknown user, or root."""
    if kind not in KINDS:
        raise InvalidArgument(f"unknown kind {kind!r} (user or node)")
    if not _NAME.match(name):
        raise InvalidArgument(f"invalid {kind} name {name!r}")
    if kind == "node":
        return
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        raise InvalidArgument(f"no user {name!r} on this host") from None
    if uid == 0:
        # A key stolen from a workstation must never run jobs as root here.
        raise InvalidArgument("a key cannot stand for root: register another user")


class Registered:
    """The client keys in ``authorized``: kept in memory, read again when the
    file changes, so ``mb keys add-user`` and ``remove`` count at once.

    Shared by the server's loop and the ZAP thread, hence the lock.
    """

    def __init__(self, keys: Path) -> None:
        self.keys = keys
        self.path = keys / AUTHORIZED
        self._lock = threading.Lock()
        self._by_key: dict[str, Entry] = {}
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")

    def entries(self) -> list[Entry]:
        """Every registered key, as the file has them now."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        found = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 3 or fields[0] not in KINDS:
                raise MinibatchError(
                    f"{self.path}:{number}: expected `user|node NAME KEY`"
                )
            found.append(Entry(*fields))
        return found

    def lookup(self, key: str, fresh: bool = False) -> Entry | None:
        """Who ``key`` (Z85) was registered for, or None. The file is looked
        at again when ``fresh`` or :data:`RECHECK_S` after the last look."""
        with self._lock:
            now = time.monotonic()
            if fresh or now - self._checked >= RECHECK_S:
                self._checked = now
                self._reload()
            return self._by_key.get(key)

    def _reload(self) -> None:
        try:
            st = self.path.stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._by_key = {e.key: e for e in self.entries()}
            self._stamp = stamp

    def add(self, kind: str, name: str, key: str) -> Entry:
        check_entry(kind, name)
        entry = Entry(kind, name, check_key(key))
        entries = self.entries()
        for old in entries:
            if old.key == entry.key:
                raise InvalidArgument(
                    f"this key is already registered for {old.kind} {old.name}"
                )
        self._save([*entries, entry])
        return entry

    def remove(self, what: str) -> list[Entry]:
        """Drop the keys registered under the name ``what``, or the key ``what``."""
        entries = self.entries()
        gone = [e for e in entries if what in (e.name, e.key)]
        if not gone:
            raise InvalidArgument(f"no key is registered for {what!r}")
        self._save([e for e in entries if e not in gone])
        return gone

    def _save(self, entries: list[Entry]) -> None:
        state = self.keys.parent
        _private_dir(self.keys, state)
        text = "# mb keys: client keys this server accepts over tcp\n"
        text += "".join(e.line() + "\n" for e in entries)
        _write(self.path, text, 0o600, state)

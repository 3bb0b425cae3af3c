"""The user name and password the server publishes events with.

Anyone on the machine may subscribe to a cluster's events, but only the server
may publish them: a job's state on ``minibatch/v1/...`` is the server's word,
and a user who could publish there could forge it for everyone who listens
(retained messages included). The broker ``mb up`` starts (amqtt or mosquitto)
takes publications only from the holder of these credentials. They live in
``run/mqtt.credentials``, one line ``user:password``, mode 0600, owned by the
daemons' user: made by ``mb up``, read by the broker and by the server. With a
broker of one's own (``[mqtt] url``), write the file to match its password file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import NamedTuple

#: The user name ``mb up`` gives the server.
SERVER_USER = "minibatch-server"


class Credentials(NamedTuple):
    user: str
    password: str


def read(path: Path) -> Credentials | None:
    """The credentials in ``path``; None if there is no such file.

    Raises:
        ValueError: the file is not one ``user:password`` line.
    """
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise ValueError(f"{path}: expected one line user:password")
    return Credentials(user, password)


def ensure(path: Path) -> Credentials:
    """The credentials in ``path``, made (mode 0600) if there are none yet.

    Kept across restarts: a running server and a restarted broker must agree.
    """
    found = read(path)
    if found is not None:
        return found
    made = Credentials(SERVER_USER, secrets.token_urlsafe(32))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another mb up made it first: theirs it is
        return ensure(path)
    with os.fdopen(fd, "w") as f:
        f.write(f"{made.user}:{made.password}\n")
    return made

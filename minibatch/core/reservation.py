"""Advance reservations: CPUs held on nodes for a time window (Maui ``setres``).

A reservation names concrete CPU ids (the server picks them when it is created),
a window ``[start, end)`` and the users who may run inside it. A reservation
without users is a *downtime* (system) reservation: no job may use its CPUs
during the window, which is how maintenance is announced ahead of time.
"""

# Annotations evaluated at import: see minibatch/protocol/messages.py.
import re
from typing import Final

import msgspec

from minibatch.core.job import Allocation
from minibatch.core.snapshot import ReservationView

#: Reservation names: they appear in MQTT topics and ``qsub -l advres=NAME``.
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    start: float
    end: float
    #: The CPUs held, by node (ids as the node daemons know them).
    alloc: list[Allocation]
    #: Who may run jobs inside; empty for a downtime reservation.
    users: list[str] = []
    #: Who created it, and when.
    owner: str = ""
    created: float = 0.0
    comment: str = ""

    @property
    def kind(self) -> str:
        """Maui's type column: ``User`` for a user reservation, else ``System``."""
        return "User" if self.users else "System"

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def cpus(self) -> int:
        return sum(len(a.cpus) for a in self.alloc)

    def overlaps(self, t0: float, t1: float) -> bool:
        """Whether the window meets ``[t0, t1)``."""
        return self.start < t1 and t0 < self.end

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def allows(self, user: str) -> bool:
        return user in self.users

    def cpus_on(self, node: str) -> list[int]:
        for a in self.alloc:
            if a.node == node:
                return a.cpus
        return []

    def view(self) -> ReservationView:
        return ReservationView(
            name=self.name,
            start=self.start,
            end=self.end,
            nodes=tuple((a.node, len(a.cpus)) for a in self.alloc),
            users=tuple(self.users),
        )

"""``GET /whatif?policy=NAME``: the queue as it is now, simulated under the policy
in force and under NAME (:func:`minibatch.sim.whatif.whatif`), as JSON.

Read-only like the rest of the page: the snapshot is the one any user may take
(``GetSnapshot(peek=True)``: nothing changes), and NAME must be one of the
policies the cluster could be set to (installed, or named in the configuration),
never a ``module:callable``. One simulation runs at a time, in a thread: the
page stays live meanwhile, and a second request is told to come back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING

import msgspec

from minibatch.errors import InvalidArgument, MinibatchError
from minibatch.web.http import HttpError, shown

if TYPE_CHECKING:
    from minibatch.config import Config, Paths
    from minibatch.sim.whatif import WhatIf

log = logging.getLogger(__name__)

#: Seconds the snapshot request may take.
SNAPSHOT_TIMEOUT = 10.0


class WhatIfs:
    """Answers ``/whatif`` with ``simulate(name)``, one at a time.

    Args:
        policies: The names a request may give.
        simulate: The comparison for one policy name (blocking: run in a thread).
    """

    def __init__(self, policies: list[str], simulate: Callable[[str], WhatIf]) -> None:
        self.policies = policies
        self._simulate = simulate
        self._busy = asyncio.Lock()

    @property
    def busy(self) -> bool:
        """A simulation is running."""
        return self._busy.locked()

    def policy(self, query: dict[str, str]) -> str:
        """The policy a query names.

        Raises:
            HttpError: 400 for anything but one known ``policy``.
        """
        extra = set(query) - {"policy"}
        if extra:
            names = ", ".join(sorted(extra))
            raise HttpError(
                HTTPStatus.BAD_REQUEST,
                f"/whatif takes policy only (got {shown(names)})",
            )
        name = query.get("policy", "")
        if name not in self.policies:
            raise HttpError(
                HTTPStatus.BAD_REQUEST,
                f"unknown policy {shown(name)} (one of {', '.join(self.policies)})",
            )
        return name

    async def answer(self, query: dict[str, str]) -> bytes:
        """The comparison as JSON.

        Raises:
            HttpError: A bad query (400), a simulation already running (503),
                the server or the policy refusing (503), a policy's bug (500).
        """
        name = self.policy(query)
        if self.busy:
            raise HttpError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "another what-if is being simulated; try again in a moment",
            )
        async with self._busy:
            try:
                result = await asyncio.to_thread(self._simulate, name)
            except InvalidArgument as exc:
                raise HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from None
            except MinibatchError as exc:
                message = str(exc) or type(exc).__name__
                raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, message) from None
            except Exception as exc:
                # A policy's own bug, met in this process: said, and logged with
                # its traceback for whoever runs mb web; the page stays up.
                log.exception("what if %s: the simulation failed", name)
                raise HttpError(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"the simulation failed: {exc!r}",
                ) from None
        return msgspec.json.encode(result)


def for_cluster(paths: Paths, config: Config) -> WhatIfs:
    """What-ifs against the cluster of ``paths``."""
    from minibatch.policy import registry

    modules = config.scheduler.policy_modules
    endpoint = config.client_endpoint(paths)

    def simulate(name: str) -> WhatIf:
        from minibatch.net.client import Client
        from minibatch.protocol.scheduling import GetSnapshot
        from minibatch.sim.whatif import whatif

        with Client(endpoint, SNAPSHOT_TIMEOUT) as client:
            reply = client.call(GetSnapshot(peek=True))
        return whatif(
            reply.snapshot, name, {}, reply.policy, reply.params, modules=modules
        )

    return WhatIfs(registry.available(modules), simulate)

"""amqtt plugins of the embedded broker: everyone may listen, only the server speaks.

:class:`ServerOnlyAuth` admits anonymous clients and the server (the user and
password of :mod:`minibatch.events.credentials`), and no one else: a wrong
password is refused rather than taken as anonymous. :class:`ServerOnlyPublish`
drops every publication that does not come from the server, retained ones
included (amqtt stores a retained message only once the topic check passed).
amqtt does not check a client's *will* against the topic plugins, so an
anonymous client that sets one is refused at connection: otherwise it could
leave a forged retained event behind by disconnecting.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amqtt.contexts import Action
from amqtt.plugins.base import BaseAuthPlugin, BaseTopicPlugin

from minibatch.events import credentials


def _server(context: Any) -> credentials.Credentials:
    found = credentials.read(Path(context.config.credentials))
    if found is None:
        raise FileNotFoundError(f"no credentials file {context.config.credentials}")
    return found


class ServerOnlyAuth(BaseAuthPlugin):  # type: ignore[misc]
    @dataclass
    class Config:
        #: The ``user:password`` file (``run/mqtt.credentials``).
        credentials: str = ""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.server = _server(context)

    async def authenticate(self, *, session: Any) -> bool:
        if not session.username:
            if session.will_flag:
                self.context.logger.warning(
                    "refused client %s: an anonymous client may not leave a will",
                    session.client_id,
                )
                return False
            return True
        given = (session.password or "").encode()
        return session.username == self.server.user and hmac.compare_digest(
            given, self.server.password.encode()
        )


class ServerOnlyPublish(BaseTopicPlugin):  # type: ignore[misc]
    @dataclass
    class Config:
        credentials: str = ""

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self.user = _server(context).user

    async def topic_filtering(
        self,
        *,
        session: Any = None,
        topic: str | None = None,
        action: Action | None = None,
    ) -> bool:
        if action != Action.PUBLISH:
            return True
        # Only an authenticated client carries this name (ServerOnlyAuth).
        return session is not None and session.username == self.user

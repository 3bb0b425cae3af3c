"""Errors with stable wire codes.

Every error a daemon can answer with is a :class:`MinibatchError` subclass carrying an
:class:`ErrorCode`. The server's dispatcher turns them into error replies; anything else
is a bug, is logged with its traceback, and is answered with ``INTERNAL``.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    VERSION = 1
    INVALID_MESSAGE = 2
    UNKNOWN_TYPE = 3
    NOT_FOUND = 4
    INVALID_TRANSITION = 5
    INFEASIBLE = 6
    PERMISSION = 7
    INVALID_ARGUMENT = 8
    UNAVAILABLE = 9
    STORAGE = 10
    INTERNAL = 99


class MinibatchError(Exception):
    code: ErrorCode = ErrorCode.INTERNAL


class ProtocolError(MinibatchError):
    code = ErrorCode.INVALID_MESSAGE


class InvalidArgument(MinibatchError):
    code = ErrorCode.INVALID_ARGUMENT


class NotFound(MinibatchError):
    code = ErrorCode.NOT_FOUND


class InvalidTransition(MinibatchError):
    code = ErrorCode.INVALID_TRANSITION


class InfeasibleRequest(MinibatchError):
    """The request can never be satisfied by this cluster: reject it now."""

    code = ErrorCode.INFEASIBLE


class PermissionDenied(MinibatchError):
    code = ErrorCode.PERMISSION


class Unavailable(MinibatchError):
    """A daemon could not be reached or did not answer in time."""

    code = ErrorCode.UNAVAILABLE


class StorageError(MinibatchError):
    """The server could not save a change (disk full, read-only, I/O error).

    Nothing of the request was kept, so sending it again later is safe.
    """

    code = ErrorCode.STORAGE

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        #: The kind of failure in words (``No space left on device``).
        self.cause = cause or message


class RemoteError(MinibatchError):
    """An error reply received from a daemon, re-raised on the client side."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = ErrorCode.INTERNAL

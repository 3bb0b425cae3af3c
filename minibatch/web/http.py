"""A deliberately small HTTP/1.1 on asyncio streams: what ``mb web`` needs, no more.

One request per connection (every response says ``Connection: close``), GET and
HEAD only, no request body read, limits on every size and on the time a client
may take to send its request. Anything else is answered with a status and a
plain-text line, never a traceback: the page is the only client meant to come,
but any local user can connect.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit

#: Longest request line or header line (bytes).
LINE_LIMIT = 8192
#: Most header lines in a request.
MAX_HEADERS = 64
#: Seconds a client may take to send its whole request head.
REQUEST_TIMEOUT = 10.0
#: Most query parameters in a request.
MAX_FIELDS = 8

#: Headers on every response: the page is self-contained (its scripts and styles
#: come from here only) and never framed by another site.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class HttpError(Exception):
    """A request answered with ``status`` and ``message`` (plain text)."""

    def __init__(
        self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class ClientGone(Exception):
    """The client closed the connection or sent nothing in time: no answer."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    #: Header names in lower case.
    headers: dict[str, str] = field(default_factory=dict)


def shown(text: str, limit: int = 60) -> str:
    """Client input quoted for a message: bounded, and never more than one line."""
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def parse_query(text: str) -> dict[str, str]:
    """``a=1&b=2`` -> ``{"a": "1", "b": "2"}``.

    Raises:
        HttpError: 400 for a malformed query, too many fields or a repeated name.
    """
    if not text:
        return {}
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            strict_parsing=True,
            errors="strict",
            max_num_fields=MAX_FIELDS,
        )
    except (ValueError, UnicodeDecodeError):
        raise HttpError(
            HTTPStatus.BAD_REQUEST, f"malformed query {shown(text)}"
        ) from None
    query: dict[str, str] = {}
    for name, value in pairs:
        if name in query:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{shown(name)} given twice")
        query[name] = value
    return query


async def _line(reader: asyncio.StreamReader) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ClientGone from None
        raise HttpError(HTTPStatus.BAD_REQUEST, "incomplete request") from None
    except asyncio.LimitOverrunError:
        raise HttpError(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request line too long"
        ) from None
    try:
        return raw.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        raise HttpError(HTTPStatus.BAD_REQUEST, "non-ASCII request head") from None


async def read_request(reader: asyncio.StreamReader) -> Request:
    """The request head from ``reader`` (its stream limit: :data:`LINE_LIMIT`).

    Raises:
        HttpError: A malformed or unsupported request.
        ClientGone: The client went away before sending a request line.
    """
    line = await _line(reader)
    parts = line.split(" ")
    if len(parts) != 3 or not parts[1]:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"malformed request line {shown(line)}")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise HttpError(
            HTTPStatus.HTTP_VERSION_NOT_SUPPORTED,
            f"unsupported version {shown(version)}",
        )
    headers: dict[str, str] = {}
    for count in range(MAX_HEADERS + 1):
        header = await _line(reader)
        if not header:
            break
        if count == MAX_HEADERS:
            raise HttpError(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header lines"
            )
        name, colon, value = header.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(HTTPStatus.BAD_REQUEST, f"malformed header {shown(header)}")
        headers[name.lower()] = value.strip()
    if method not in ("GET", "HEAD"):
        raise HttpError(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"method {shown(method)} not allowed: the page is read-only",
            {"Allow": "GET, HEAD"},
        )
    if not target.startswith("/"):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"malformed target {shown(target)}")
    parsed = urlsplit(target)
    return Request(method, parsed.path, parse_query(parsed.query), headers)


def head(
    status: HTTPStatus,
    content_type: str,
    length: int | None,
    extra: dict[str, str] | None = None,
) -> bytes:
    """A response's status line and headers; without ``length`` the body runs
    until the connection closes (a stream)."""
    lines = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {content_type}",
    ]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    headers = {**SECURITY_HEADERS, **(extra or {}), "Connection": "close"}
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")


def error_response(exc: HttpError, with_body: bool = True) -> bytes:
    body = (exc.message + "\n").encode()
    status = head(exc.status, "text/plain; charset=utf-8", len(body), exc.headers)
    return status + (body if with_body else b"")

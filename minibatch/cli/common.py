"""What every command shares: reaching the server, reporting errors, and the
values several commands accept (job ids, job names, counts).

Errors end a command with one line, ``<prog>: <message>``, on stderr and never a
traceback. Exit codes follow typer/click: 2 for a usage error caught before anything
is sent, 1 for everything the server refused or could not do. This module stays
cheap to import (no typer at module level) because ``qsub`` imports it.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NoReturn

from minibatch.core.job import MAX_NAME
from minibatch.errors import InvalidArgument, MinibatchError, Unavailable

if TYPE_CHECKING:
    from minibatch.config import Config, Paths
    from minibatch.net.client import Client
    from minibatch.protocol.messages import Message

_SELECTOR = re.compile(r"^(\d+)(\[\d*\])?(?:\.[\w.-]+)?$", re.ASCII)

USAGE_EXIT = 2
ERROR_EXIT = 1

#: For commands (e.g. ``qsub``) whose ``-h`` means something else.
HELP_ONLY_LONG: Mapping[str, Any] = {"help_option_names": ["--help"]}


def exit_code(exc: MinibatchError) -> int:
    """2 for bad input caught on this side, 1 for anything else."""
    # A RemoteError is never an InvalidArgument, even when the server says the
    # argument was bad: the request was sent, so it is not a usage error.
    return USAGE_EXIT if isinstance(exc, InvalidArgument) else ERROR_EXIT


def dump_json(value: Any) -> str:
    """``--json`` output: indented, one final newline."""
    import json  # only --json pays for it

    return json.dumps(value, indent=2) + "\n"


def parse_selector(text: str) -> str:
    """A job id as users write it -> the server's selector: ``7``, ``7[]``, ``7[2]``.

    A ``.server`` suffix, as in PBS ids pasted from elsewhere, is dropped.
    """
    m = _SELECTOR.match(text.strip())
    if m is None:
        raise InvalidArgument(f"malformed job id {text!r} (expected e.g. 7, 7[], 7[2])")
    return m.group(1) + (m.group(2) or "")


def positive_int(text: str, what: str) -> int:
    """A count that must be a whole number of at least 1."""
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        raise InvalidArgument(f"{what} must be a positive integer, got {text!r}")
    return int(value)


def check_name(name: str, spaces: bool = False) -> str:
    """A job name: it becomes part of file names (NAME.oID), so no blanks or
    '/' (``spaces``: but spaces, as Slurm takes them), and not so long that
    NAME.oID is longer than a file name may be."""
    blank = (lambda c: c.isspace() and c != " ") if spaces else str.isspace
    if not name.strip() or any(blank(c) or c == "/" for c in name):
        what = "other blanks" if spaces else "spaces"
        raise InvalidArgument(f"invalid job name {name!r} (no {what} or '/')")
    if len(name) > MAX_NAME:
        raise InvalidArgument(
            f"job name too long ({len(name)} characters, at most {MAX_NAME})"
        )
    return name


def fail(prog: str, message: str, code: int = ERROR_EXIT) -> None:
    """Print ``prog: message`` on stderr and exit with ``code``."""
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(code)


def run_and_exit(command: Callable[[], None]) -> NoReturn:
    """Run a console script's body, then end the process without tearing the
    interpreter down: its output is flushed and its request answered by then,
    and the teardown (freeing every module, closing the ZeroMQ context) is
    10-15 ms of a command that scripts call in loops."""
    # Nor does it collect garbage: a reply of 1,000 jobs decodes into tens of
    # thousands of containers, which set off collections that find no cycle
    # to free (nor would they between a qsub -W block=true's polls): ~3 ms of
    # a qstat of 1,000 jobs. The process ends with os._exit anyway.
    gc.disable()
    code: int | str | None = 0
    try:
        command()
    except SystemExit as exc:
        code = exc.code
    except BrokenPipeError:  # the reader went away (qsub | head -c0)
        code = ERROR_EXIT
    if isinstance(code, str):  # SystemExit("message"): print it, exit 1
        if sys.stderr is not None:
            print(code, file=sys.stderr)
        code = ERROR_EXIT
    elif code is not None and not isinstance(code, int):
        code = ERROR_EXIT
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with it closed (qsub job.sh >&-)
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or file: nothing to tell
            code = code or ERROR_EXIT
    os._exit(code or 0)


@contextmanager
def reporting(prog: str) -> Iterator[None]:
    """Turn a MinibatchError, a file the command cannot write or read, or
    Ctrl-C inside the block into one line and an exit."""
    try:
        yield
    except MinibatchError as exc:
        fail(prog, str(exc) or type(exc).__name__, exit_code(exc))
    except BrokenPipeError:
        # The reader went away (mb status | head -1): nothing to tell it, and
        # the interpreter's last flush must not complain about it either.
        with suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(ERROR_EXIT) from None
    except FileExistsError as exc:  # mkdir of an output directory that is a file
        fail(prog, f"{exc.filename}: exists and is not a directory", ERROR_EXIT)
    except NotADirectoryError as exc:
        fail(prog, f"{exc.filename}: a part of it is not a directory", ERROR_EXIT)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        fail(prog, f"{where}{exc.strerror or exc}", ERROR_EXIT)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def connect(timeout: float = 10.0) -> Client:
    """A client for the server of the cluster in ``$MB_HOME``."""
    # Imported here so that a usage error never pays for the client.
    from minibatch.homedir import client_endpoint
    from minibatch.net.client import Client

    endpoint = client_endpoint()
    # No socket file means no server: say so now rather than after the timeout.
    if endpoint.startswith("ipc://") and not os.path.exists(endpoint[6:]):
        raise Unavailable(
            f"no minibatch server at {endpoint} (is the cluster up? try `mb up`)"
        )
    return Client(endpoint, timeout=timeout)


def home() -> tuple[Paths, Config]:
    """This cluster's places (from ``$MB_HOME``) and its configuration."""
    from minibatch.config import Paths, load

    paths = Paths.from_env()
    return paths, load(paths)


def call(message: Message, timeout: float = 10.0) -> Any:
    """Send one request to the server and return its reply."""
    with connect(timeout) as client:
        return client.call(message)


def script(
    function: Callable[..., Any],
    prog: str,
    context_settings: Mapping[str, Any] | None = None,
) -> NoReturn:
    """A console script's body: :func:`run_command`, ended by :func:`run_and_exit`."""
    run_and_exit(lambda: run_command(function, prog, context_settings=context_settings))


def run_command(
    function: Callable[..., Any],
    prog: str,
    argv: list[str] | None = None,
    context_settings: Mapping[str, Any] | None = None,
) -> NoReturn:
    """Run the typer command ``function`` as ``prog`` and exit: without typer
    when :func:`minibatch.cli.fastargs.parse` can parse ``argv`` (default:
    ``sys.argv[1:]``), else with :func:`run_typer`."""
    from minibatch.cli import fastargs  # not for qsub, which parses its own

    args = sys.argv[1:] if argv is None else argv
    kwargs = fastargs.parse(function, args, context_settings)
    if kwargs is None:
        run_typer(function, prog, args, context_settings)
    code = function(**kwargs)
    raise SystemExit(code if isinstance(code, int) else 0)


def run_typer(
    function: Callable[..., Any],
    prog: str,
    argv: list[str] | None = None,
    context_settings: Mapping[str, Any] | None = None,
) -> NoReturn:
    """Run ``function`` as a stand-alone typer command named ``prog`` and exit.

    Usage errors are printed as one ``prog: message`` line (exit 2) instead of
    click's three-line usage block or typer's rich panel.

    Args:
        function: The command, declared as for ``typer.Typer.command``.
        prog: The program name used in help and error messages.
        argv: The arguments (default: ``sys.argv[1:]``).
        context_settings: Passed to click, e.g. :data:`HELP_ONLY_LONG`.
    """
    import typer
    import typer.main

    app = typer.Typer(
        add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False
    )
    app.command(context_settings=dict(context_settings or {}))(function)
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name=prog, standalone_mode=False)
    except Exception as exc:
        # click's exceptions (vendored by newer typer, separate in older) share
        # this shape; anything else is a bug and keeps its traceback.
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        fail(prog, exc.format_message(), exc.exit_code)
    raise SystemExit(code if isinstance(code, int) else 0)

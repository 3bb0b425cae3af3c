"""``$MB_HOME`` and where a command reaches its server, without pathlib.

A command needs one string from the cluster's home: the server's socket. Its
:class:`minibatch.config.Paths` is a ``pathlib.Path``, and ``pathlib`` (with
the ``urllib.parse`` and ``ipaddress`` it imports) is ~3 ms of a ``qsub`` that
should answer in 40 (docs/benchmarks.md, "Commands"). So the home is found
here, as strings, and :mod:`minibatch.config` is imported only when the home
has a configuration file to read.
"""

from __future__ import annotations

import os

#: The configuration file's name in the home.
CONFIG_NAME = "minibatch.toml"


def home_dir() -> str:
    """``$MB_HOME`` (default ``~/.minibatch``), ``~`` expanded, made absolute
    against the current directory as ``Path.absolute`` does (``..`` is kept:
    across a symbolic link it is not the same as dropping a component)."""
    home = os.path.expanduser(os.environ.get("MB_HOME") or "~/.minibatch")
    if not os.path.isabs(home):
        home = os.path.join(os.getcwd(), home)
    # As pathlib spells it: no "." parts, no repeated or trailing "/" (the
    # same socket path whichever module a command or a daemon found it with).
    return "/" + "/".join(p for p in home.split("/") if p and p != ".")


def default_endpoint(home: str) -> str:
    """The ipc socket the server of ``home`` binds unless configured."""
    return f"ipc://{os.path.join(home, 'run', 'server.sock')}"


def env_server() -> str:
    """``$MB_SERVER`` ("" when unset); InvalidArgument names a value that is
    no endpoint (a bare path or a name would reach ZeroMQ as one)."""
    value = os.environ.get("MB_SERVER", "")
    if value and not value.startswith(("ipc://", "tcp://")):
        from minibatch.errors import InvalidArgument

        raise InvalidArgument(
            f"MB_SERVER {value!r} is not an endpoint (ipc://PATH or tcp://HOST:PORT)"
        )
    return value


def client_endpoint() -> str:
    """Where this host's commands reach the server of ``$MB_HOME``:
    :meth:`minibatch.config.Config.client_endpoint` of its configuration, or
    with none, ``$MB_SERVER`` else the default socket."""
    home = home_dir()
    try:
        os.stat(os.path.join(home, CONFIG_NAME))
    except FileNotFoundError:
        return env_server() or default_endpoint(home)
    except OSError:
        pass  # unreadable: load() names the file and why
    from minibatch.config import Paths, load

    paths = Paths.from_env()
    return load(paths).client_endpoint(paths)

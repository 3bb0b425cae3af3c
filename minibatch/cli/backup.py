"""``mb backup DEST``: a consistent copy of the state database, taken while the
cluster runs.

SQLite's online backup API copies the database inside one read transaction
(``pages=-1``: one step), so the copy is the database as of one commit: every
job acknowledged before the backup began, nothing half-written. In WAL mode a
reader never blocks the server, which goes on committing meanwhile. The copy is
written beside DEST and renamed over it once complete and synced, so DEST is
never a partial file. Restoring is docs/operations.md's "Backup and restore".
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from minibatch.cli import common


def backup_command(
    dest: Annotated[Path, typer.Argument(metavar="DEST", help="The file to write.")],
    force: Annotated[
        bool, typer.Option("--force", "-f", help="Overwrite DEST if it exists.")
    ] = False,
) -> None:
    """Copy the state database (jobs, accounting, nodes, reservations) to DEST,
    while the cluster runs."""
    with common.reporting("mb backup"):
        paths, _ = common.home()
        source = paths.database
        if not source.is_file():
            common.fail("mb backup", f"no database at {source}")
        if dest.is_dir():
            common.fail("mb backup", f"{dest} is a directory; name the file")
        if dest.exists() and not force:
            common.fail("mb backup", f"{dest} exists (--force to overwrite it)")
        try:
            active, finished = copy(source, dest)
        except (OSError, sqlite3.Error) as exc:
            common.fail("mb backup", f"cannot back up {source} to {dest}: {exc}")
        typer.echo(
            f"wrote {dest}: {active} jobs queued or running, {finished} finished "
            f"({dest.stat().st_size} bytes)"
        )


def copy(source: Path, dest: Path) -> tuple[int, int]:
    """Back ``source`` up to ``dest``; its (active, finished) job counts."""
    # Mode 0600 from mkstemp: the copy holds every job's environment and script.
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    part = Path(name)
    try:
        counts = _backup(source, part)
        with part.open("rb") as handle:
            os.fsync(handle.fileno())
        part.replace(dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    _sync_dir(dest.parent)
    return counts


def _backup(source: Path, part: Path) -> tuple[int, int]:
    # Read-only: a mistake here can never write to the live database.
    src = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(part)
        try:
            src.backup(dst, pages=-1)
            # One self-contained file: the server turns WAL on again when it
            # opens a restored copy.
            dst.execute("PRAGMA journal_mode=DELETE")
            (check,) = dst.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"the copy fails its check: {check}")
            (active,) = dst.execute("SELECT count(*) FROM jobs").fetchone()
            (finished,) = dst.execute("SELECT count(*) FROM accounting").fetchone()
        finally:
            dst.close()
    finally:
        src.close()
    return int(active), int(finished)


def _sync_dir(directory: Path) -> None:
    """Make the rename durable (best effort: not every file system can)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

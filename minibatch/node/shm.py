"""What a job leaves in ``/dev/shm``: memory that outlives it unless removed.

Files in ``/dev/shm`` are memory, charged to the job's memory cgroup while they
exist, and nothing removes them when the job ends (POSIX shared memory,
``multiprocessing``, MPI transports). The node removes them when the job's cgroup
still holds shared memory after its last process is gone. A file is the job's
when its owner is the job's user, it changed after the job started, and no
process has it open or mapped. Files of a user with another job running on the
node are left alone: they cannot be told apart from that job's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

SHM = Path("/dev/shm")
#: File times come from the kernel's coarse clock, a few ms behind time.time().
_CLOCK_SLACK = 0.1


def _in_use(dev: int) -> set[int]:
    """Inodes of the /dev/shm file system (device ``dev``) some process has
    open or mapped. Inodes, not paths: a file is often mapped under another
    name (glibc creates a named semaphore aside, then links it)."""
    used: set[int] = set()
    prefix = str(SHM) + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}/fd/{fd}")
                    if st.st_dev == dev:
                        used.add(st.st_ino)
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if prefix in line:
                    # address perms offset dev inode path
                    used.add(int(line.split(maxsplit=5)[4]))
    return used


def remove_left(
    uid: int, since: float, busy_uids: set[int], root: Path = SHM
) -> list[str]:
    """Remove the top-level entries of ``root`` the job of ``uid`` that started
    at ``since`` left behind; returns their names."""
    if uid in busy_uids:
        return []
    candidates: list[Path] = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            with contextlib.suppress(OSError):
                st = entry.lstat()
                if st.st_uid == uid and st.st_mtime >= since - _CLOCK_SLACK:
                    candidates.append(entry)
    if not candidates:
        return []
    used = _in_use(root.stat().st_dev)
    removed: list[str] = []
    for entry in candidates:
        with contextlib.suppress(OSError):
            inodes = {entry.lstat().st_ino}
            if entry.is_dir() and not entry.is_symlink():
                inodes |= {p.lstat().st_ino for p in entry.rglob("*")}
            if inodes & used:
                continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
    return removed

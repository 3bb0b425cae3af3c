"""Thrashing at a memory limit: what the kernel's OOM killer leaves running.

A job whose memory fills its cgroup's limit is OOM-killed only when reclaim
frees nothing. While any of its file pages are left (its program's own code
among them), the kernel evicts them to make room and reads them back at the
next instruction that needs them, and counts each eviction as progress: such
a job can crawl for minutes, or until its walltime (``jobs/examples/thrash.py``
does; so did ``memhog.py`` once in a while). systemd-oomd ends such a unit by
its memory pressure; this does the same for a job, from three things the
kernel says at each sample:

* the job is at its limit with no room left: its usage is within a sliver of
  the limit, and so are its file pages (the only ones it could give back;
  there is no swap for the rest);
* since the last look the kernel has read back more of its file pages that
  it had evicted (``workingset_refault_file``);
* tasks stalled on memory (PSI's ``some`` time) for at least
  :data:`STALL_SHARE` of the time since the spell began: the job's own
  ``memory.pressure`` on cgroup v2; on v1, which has none, the machine's
  ``/proc/pressure/memory``, which a job at its limit with no room is the
  likely cause of.

Over :data:`LOOKS` looks in a row and the supervisor's ``_THRASH_S`` seconds,
that is out of memory. A job that reads files through a cache that is most of
its memory has room; one that re-reads a file through a small cache, at the
pace of its work, stalls far less than :data:`STALL_SHARE` (0.12-0.15 of the
time here, against 0.37-0.68 for a thrashing one, with and without two CPUs
of other load). Where the kernel keeps no pressure or refault counts, nothing
is ever judged thrashing.
"""

from __future__ import annotations

from typing import NamedTuple

#: Share of the spell's time tasks must have stalled on memory.
STALL_SHARE = 0.25
#: Looks in a row the job must be seen thrashing (two late ticks of a busy
#: daemon are not enough).
LOOKS = 4


class Sample(NamedTuple):
    """A job's memory cgroup at one look (bytes; counts since its start)."""

    used: int
    limit: int
    #: Its file pages: page cache without shared memory (never evicted).
    files: int
    refaults: int
    #: Microseconds some task stalled on memory (PSI); None where not kept.
    stall_us: int | None


def sliver(limit: int) -> int:
    """Bytes of a memory limit that count as no room: 4 % of it, at least
    2 MiB (a program's hot code alone is about that) and at most 256 MiB."""
    return max(2 << 20, min(limit // 25, 256 << 20))


class Watch:
    """The looks at one job, and the spell of thrashing they may show."""

    def __init__(self) -> None:
        self._refaults = -1
        #: When the spell began, the stall count then, and its looks.
        self._spell: tuple[float, int, int] | None = None

    def look(self, sample: Sample | None, now: float) -> float:
        """Seconds the job has been thrashing, 0 while it is not (or not for
        :data:`LOOKS` looks, or not stalling enough)."""
        if sample is None or not sample.limit or sample.stall_us is None:
            self._spell = None
            return 0.0
        room = sliver(sample.limit)
        full = sample.used >= sample.limit - room and sample.files <= room
        rising = 0 <= self._refaults < sample.refaults
        self._refaults = sample.refaults
        if not (full and rising):
            self._spell = None
            return 0.0
        if self._spell is None:
            self._spell = (now, sample.stall_us, 1)
            return 0.0
        since, stall, looks = self._spell
        self._spell = (since, stall, looks + 1)
        spent = now - since
        if looks + 1 < LOOKS or spent <= 0:
            return 0.0
        share = (sample.stall_us - stall) / 1e6 / spent
        return spent if share >= STALL_SHARE else 0.0

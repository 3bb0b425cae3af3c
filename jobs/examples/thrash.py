#!/usr/bin/env python3
#PBS -N thrash
#PBS -l ncpus=1,mem=256mb,walltime=00:01:00
"""Fill the memory limit, then keep reading a file: the job thrashes.

With no room left, the kernel evicts the file's pages (and the interpreter's
own code) to read the next ones, and reads them back at the next pass. Its
OOM killer counts each eviction as progress, so the job would crawl until its
walltime; the node daemon ends it as out_of_memory after a few seconds.
Run with ``qsub`` on a node with cgroups (root); THRASH_FILE_MB sizes the file.
"""

import os
import time


def memory_cgroup() -> tuple[str, str, int]:
    """The job's memory cgroup, the name of its anonymous memory in
    ``memory.stat``, and its limit (bytes)."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(","):
            where, anon, limit = f"/sys/fs/cgroup/memory{path}", "rss", "limit_in_bytes"
            break
    else:  # cgroup v2: one hierarchy, its line is "0::/path"
        where, anon, limit = f"/sys/fs/cgroup{lines[-1][2]}", "anon", "max"
    try:
        with open(f"{where}/memory.{limit}") as f:
            text = f.read().strip()
    except OSError:
        raise SystemExit(
            "no memory cgroup: run me as a job on a node with cgroups"
        ) from None
    if not text.isdigit() or int(text) >= 1 << 62:
        raise SystemExit("no memory limit: I would fill the machine (qsub me)")
    return where, anon, int(text)


def stat(where: str, key: str) -> int:
    with open(f"{where}/memory.stat") as f:
        for line in f:
            name, value = line.split()
            if name == key:
                return int(value)
    return 0


where, anon, limit = memory_cgroup()
# In the job's own $TMPDIR: the node removes it however the job ends.
path = os.path.join(os.environ.get("TMPDIR", "."), f"thrash-data.{os.getpid()}")
with open(path, "wb") as f:
    for _ in range(int(os.environ.get("THRASH_FILE_MB", "32"))):
        f.write(os.urandom(1 << 20))
    # Clean pages, which the kernel may evict at once: dirty ones waiting for
    # a busy disk would leave it nothing to reclaim but an OOM kill.
    os.fsync(f.fileno())
# Anonymous memory up to 8 MB short of the limit: what is left holds the
# interpreter's code and a quarter of the file, so the kernel evicts and
# reads back, never without a page to reclaim (that would be an OOM kill).
chunks = []
while stat(where, anon) < limit - (8 << 20):
    chunks.append(bytearray(256 << 10))
print(f"{stat(where, anon) >> 20} MB of {limit >> 20} MB held", flush=True)
buffer = bytearray(1 << 20)  # read into, so that reading takes no memory
start = time.monotonic()
try:
    for n in range(1, 1_000_000):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
        print(f"pass {n} at {time.monotonic() - start:.1f} s", flush=True)
finally:
    os.unlink(path)

#!/usr/bin/env python3
#PBS -N thrash
#PBS -l ncpus=1,mem=64mb,walltime=00:01:00
"""Fill the memory limit, then keep reading a file: the job thrashes.

With no room left, the kernel evicts the file's pages (and the interpreter's
own code) to read the next ones, and reads them back at the next pass. Its
OOM killer counts each eviction as progress, so the job would crawl until its
walltime; the node daemon ends it as out_of_memory after a few seconds.
Run with ``qsub`` on a node with cgroups (root); THRASH_FILE_MB sizes the file.
"""

import os
import time


def memory_cgroup() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return f"/sys/fs/cgroup/memory{path}"
    raise SystemExit("no v1 memory cgroup: run me as a job on a node with cgroups")


def stat(where: str, key: str) -> int:
    with open(f"{where}/memory.stat") as f:
        for line in f:
            name, value = line.split()
            if name == key:
                return int(value)
    return 0


where = memory_cgroup()
with open(f"{where}/memory.limit_in_bytes") as f:
    limit = int(f.read())
# In the job's own $TMPDIR: the node removes it however the job ends.
path = os.path.join(os.environ.get("TMPDIR", "."), f"thrash-data.{os.getpid()}")
with open(path, "wb") as f:
    for _ in range(int(os.environ.get("THRASH_FILE_MB", "16"))):
        f.write(os.urandom(1 << 20))
# Anonymous memory up to the limit: the kernel makes room by evicting files.
chunks = []
while stat(where, "rss") < limit - (1 << 20):
    chunks.append(bytearray(256 << 10))
print(f"{stat(where, 'rss') >> 20} MB of {limit >> 20} MB held", flush=True)
start = time.monotonic()
try:
    for n in range(1, 1_000_000):
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        print(f"pass {n} at {time.monotonic() - start:.1f} s", flush=True)
finally:
    os.unlink(path)

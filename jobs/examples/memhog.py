#!/usr/bin/env python3
#PBS -N memhog
#PBS -l ncpus=1,mem=64mb,walltime=00:00:30
"""Touch more memory than the job asked for; the node daemon kills it (out_of_memory)."""

import os
import time

mb = int(os.environ.get("MEMHOG_MB", "256"))
chunks = []
for _ in range(mb):
    chunks.append(bytearray(1024 * 1024))  # bytearray pages are written, so resident
    time.sleep(0.005)
print(f"allocated {mb} MB without being stopped")

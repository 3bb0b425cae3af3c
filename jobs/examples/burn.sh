#!/bin/sh
#PBS -N burn
#PBS -l ncpus=1,walltime=00:01:00
# Keep one CPU busy for $BURN_SECONDS seconds (default 10), then say where it ran
# and how much CPU time it got.
secs=${BURN_SECONDS:-10}
echo "job $PBS_JOBID on node $MB_NODE, CPUs $MB_CPU_LIST"
timeout "$secs" sh -c 'while :; do :; done' || [ $? -eq 124 ]
times  # the CPU time the shell and what it waited for used, as the kernel counted
echo "burned $secs s"

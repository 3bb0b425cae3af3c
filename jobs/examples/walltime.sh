#!/bin/sh
#PBS -N walltime
#PBS -l ncpus=1,walltime=00:00:02
# Sleep far past the walltime: the node daemon sends SIGTERM, then SIGKILL after
# the grace period, and the job ends as a timeout.
echo "job $PBS_JOBID sleeping 60 s with a 2 s walltime"
sleep 60
echo "still here after 60 s: the walltime was not enforced"

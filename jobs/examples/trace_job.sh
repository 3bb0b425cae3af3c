#!/bin/sh
#PBS -N trace_job
#PBS -l ncpus=1,walltime=00:01:00
# A job of a replayed trace (mb replay): hold the job's CPUs for $1 seconds
# (default $HOLD_SECONDS, else 10) of wall-clock time. It sleeps rather than
# burns, so its run time is the trace's however many jobs share the real cores.
secs=${1:-${HOLD_SECONDS:-10}}
echo "start job=$PBS_JOBID node=$MB_NODE cpus=$MB_CPU_LIST seconds=$secs"
sleep "$secs"
echo "done seconds=$secs"

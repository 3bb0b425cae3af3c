#!/bin/sh
#PBS -N sweep
#PBS -l ncpus=1,walltime=00:00:30
#PBS -t 1-4
# One task of a parameter sweep: square the array index.
echo "task $PBS_ARRAYID of array $PBS_JOBID: $((PBS_ARRAYID * PBS_ARRAYID))"

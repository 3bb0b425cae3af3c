#!/bin/sh
#PBS -N hello
#PBS -l ncpus=1,walltime=00:00:30
# Print what the batch system told the job about itself.
echo "hello from job $PBS_JOBID ($PBS_JOBNAME)"
echo "node $MB_NODE, $MB_CPUS CPU(s): $MB_CPU_LIST, OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "submitted from $PBS_O_WORKDIR, running in $(pwd)"
echo "affinity: $(taskset -pc $$ 2>/dev/null | sed 's/.*: //')"

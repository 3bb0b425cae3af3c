#!/bin/sh
#PBS -N omp
#PBS -l ncpus=2,walltime=00:01:00
# One busy worker per allocated CPU, as an OpenMP program would start.
secs=${BURN_SECONDS:-5}
for _ in $(seq "$OMP_NUM_THREADS"); do
  timeout "$secs" sh -c 'while :; do :; done' &
done
wait
echo "$OMP_NUM_THREADS workers on CPUs $MB_CPU_LIST"

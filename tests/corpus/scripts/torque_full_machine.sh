#!/bin/bash -l
#PBS -l nodes=4:ppn=16
#PBS -l walltime=24:00:00
#PBS -l pmem=3800mb
#PBS -N cfd_full
#PBS -q long
#PBS -m bea
#PBS -M cfd-group@example.edu

# Whole partition: 4 nodes x 16 cores = 64 MPI ranks.
cd $PBS_O_WORKDIR
module load intel/15.0 impi/5.0 openfoam/2.3.1
source $FOAM_BASH

decomposePar -force > decompose.log
mpirun -np 64 simpleFoam -parallel > simpleFoam.log
reconstructPar -latestTime

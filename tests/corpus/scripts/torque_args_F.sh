#!/bin/bash
#PBS -N sweep
#PBS -l nodes=1:ppn=2
#PBS -l walltime=3600
#PBS -j oe

# Submitted as: qsub -F "input_07.dat 250" torque_args_F.sh
INPUT=$1
STEPS=$2
cd $PBS_O_WORKDIR
echo "sweep over $INPUT with $STEPS steps"
./sweep --input "$INPUT" --steps "$STEPS" --threads 2

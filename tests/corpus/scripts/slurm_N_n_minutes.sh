#!/bin/bash
#SBATCH -N 2 -n 8
#SBATCH -t 90
#SBATCH -p long
#SBATCH -J poisson

module load petsc/3.9
srun ./poisson -da_grid_x 2048 -da_grid_y 2048 -ksp_type cg -pc_type gamg

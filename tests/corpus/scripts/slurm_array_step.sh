#!/bin/bash
#SBATCH -J resample
#SBATCH --array=1-9:2
#SBATCH -n 1
#SBATCH --time=5
#SBATCH --mem-per-cpu=1G
#SBATCH -p short

module load gdal/3.0
IN=$(sed -n "${SLURM_ARRAY_TASK_ID}p" tiles.txt)
gdalwarp -tr 30 30 -r bilinear "$IN" "resampled/$(basename "$IN")"

#!/bin/bash
#SBATCH --job-name=tidy   # it's the cleanup step
#SBATCH --ntasks=1
#SBATCH --mem=4G
#SBATCH --time=01:00:00   # don't change this

find "$SCRATCH/runs" -name '*.tmp' -mtime +7 -delete
du -sh "$SCRATCH/runs"

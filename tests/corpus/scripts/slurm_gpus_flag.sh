#!/bin/bash
#SBATCH --job-name=finetune
#SBATCH --gpus=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH -o %x-%j.out

set -euo pipefail
module load cuda/12.1
source .venv/bin/activate
python finetune.py --model bert-base-uncased --epochs 3 --lr 2e-5

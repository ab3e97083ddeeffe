"""Slurm: sbatch rendering through submitit, NCCL/pyxis environment, submission, a local emulated cluster."""

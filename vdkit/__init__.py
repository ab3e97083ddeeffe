"""vdkit: validated-design recipes for Llama 2 on Dell PowerEdge XE9680 clusters (NeMo, Hydra, Slurm)."""
__version__ = "0.1.0"

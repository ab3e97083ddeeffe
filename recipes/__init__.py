"""What a job runs: the NeMo engine's config (nemo.py), the reference engine (reference/), data (data.py)."""
